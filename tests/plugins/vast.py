"""pytest fixtures: vast (owned by the vast work)."""
