"""Supervised recipes: how the embedded base model is built (`python -m sft.embedded_base`)."""
