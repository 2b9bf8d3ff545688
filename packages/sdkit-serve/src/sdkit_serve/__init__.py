"""sdkit-serve: ``sdkit serve``, an AUTOMATIC1111-compatible HTTP API on sdkit pipelines.

Importing this package imports no server library; ``sdkit_serve.app.create_app`` builds the
FastAPI app around an ``sdkit_serve.engine.Engine``, ``sdkit_serve.ray_serve`` deploys it on
Ray Serve.
"""

from __future__ import annotations

from sdkit_serve._version import __version__

__all__ = ["__version__"]
