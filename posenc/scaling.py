"""RoPE context-extension scalings: position interpolation, NTK, dynamic NTK, YaRN, Llama 3.1."""

__all__: list[str] = []
