"""Placement: the plan (pure) and the Ray placement groups built from it."""
