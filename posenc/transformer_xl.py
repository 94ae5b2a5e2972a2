"""Transformer-XL relative attention with segment memory (Dai et al., 2019)."""

__all__: list[str] = []
