"""Helpers of scripts/dev-cluster: which Slurm release runs where (`release`), the Debian 13 root
that carries Slurm 24.11 (`troot`), and running a client command against the cluster (`client`).
Tests import `client` to call sbatch, srun, ... the same way `dev-cluster run` does."""
