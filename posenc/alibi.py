"""ALiBi: attention with linear biases (Press, Smith and Lewis, 2022)."""

__all__: list[str] = []
