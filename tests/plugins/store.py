"""pytest fixtures: store (owned by the store work)."""
