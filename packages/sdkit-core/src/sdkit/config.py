"""User configuration: ``SDKIT_CONFIG`` or ``<user config dir>/sdkit/config.toml``.

```toml
backend_preference = ["ggml", "openvino"]   # tried first, in this order, by backend="auto"
```
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from sdkit.errors import SdkitError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def config_path() -> Path:
    env = os.environ.get("SDKIT_CONFIG")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_config_dir("sdkit", appauthor=False)) / "config.toml"


def load_config() -> dict[str, Any]:
    path = config_path()
    if not path.is_file():
        return {}
    try:
        data: dict[str, Any] = tomllib.loads(path.read_text(encoding="utf-8"))
        return data
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SdkitError(f"config file {path} is invalid: {exc}") from None


def backend_preference() -> list[str]:
    """``SDKIT_BACKEND`` (comma-separated) first, else the config's ``backend_preference``."""
    env = os.environ.get("SDKIT_BACKEND", "").strip()
    if env:
        return [b.strip() for b in env.split(",") if b.strip()]
    pref = load_config().get("backend_preference", [])
    if isinstance(pref, str):
        pref = [pref]
    if not isinstance(pref, list) or not all(isinstance(p, str) for p in pref):
        raise SdkitError(f"backend_preference in {config_path()} must be a list of backend names")
    return pref
