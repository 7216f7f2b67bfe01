"""slurm-hetero: mixed accelerators as one Slurm pool."""

__version__ = "0.1.0"
