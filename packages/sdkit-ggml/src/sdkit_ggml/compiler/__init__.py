"""The ONNX -> ggml compiler: the converter registry, the builder, the one per-node decision
(``support``), the lowering walk shared by compile (``build``) and ``check()`` (``check``).
Imports ``runtime`` only; never ``converters`` (the registry is filled from above)."""
