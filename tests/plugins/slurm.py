"""pytest fixtures: slurm (owned by the slurm work)."""
