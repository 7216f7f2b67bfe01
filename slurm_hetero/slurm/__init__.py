"""Reading Slurm's own files and command output."""
