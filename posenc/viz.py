"""Plot helpers shared by the chapters (needs Matplotlib)."""

__all__: list[str] = []
