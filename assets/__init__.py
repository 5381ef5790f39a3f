"""Shipped model files: the embedded base model (assets/maze-vl-base)."""
