"""Checkpoint conversion between the two RoPE feature layouts."""

__all__: list[str] = []
