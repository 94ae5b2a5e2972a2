"""DA-Transformer: distance-aware attention (Wu, Wu and Huang, 2021)."""

__all__: list[str] = []
