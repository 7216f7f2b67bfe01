"""Launching training on a heterogeneous allocation: the step's plan from Slurm's environment
(`plan`, `runnable`), each rank's environment (`rankenv`), the launcher that runs and supervises the
command (`run`, `supervise`, `early`), and `calibrate`."""
