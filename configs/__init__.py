"""Shipped run configs (YAML): the embedded CPU default, the reference run, the serve app."""
