"""T5 relative-position buckets and their learned per-head bias (Raffel et al., 2020)."""

__all__: list[str] = []
