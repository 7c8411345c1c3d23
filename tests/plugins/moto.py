"""pytest fixtures: moto (owned by the moto work)."""
