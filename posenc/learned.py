"""Learned absolute position tables (as in BERT and GPT-2)."""

__all__: list[str] = []
