"""Launching training on a heterogeneous allocation: the model's costs for the layout solver
(`costs`), and (elsewhere) the per-rank environment and the srun launcher."""
