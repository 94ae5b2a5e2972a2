"""Rotary position embedding, RoPE (Su et al., 2021)."""

__all__: list[str] = []
