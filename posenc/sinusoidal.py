"""The fixed sinusoidal table of Vaswani et al. (2017)."""

__all__: list[str] = []
