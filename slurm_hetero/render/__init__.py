"""Rendering gres.conf and slurm.conf node/partition lines from a cluster inventory."""
