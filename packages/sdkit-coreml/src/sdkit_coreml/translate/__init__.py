"""ONNX nodes -> MIL ops: the shared translation context (``context``), the converter table
(``registry``, which imports no converter), one module per op family that registers its
converters with ``@converter`` at import (``einsum``, ``elementwise``, ``layout``, ``nn``,
``norm``; ``attention`` is the fused attention ``nn`` uses) and ``builtin``, the one module that
imports them all and answers which nodes can be translated.

Importing this package imports none of them (and no coremltools).
"""
