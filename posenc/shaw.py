"""Relative position representations (Shaw, Uszkoreit and Vaswani, 2018)."""

__all__: list[str] = []
