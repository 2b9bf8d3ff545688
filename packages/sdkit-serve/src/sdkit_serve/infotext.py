"""``/sdapi/v1/png-info`` and ``/sdapi/v1/memory``: an image's generation parameters read back,
and the memory the server uses.

``parse_infotext`` reads A1111's ``parameters`` text (what ``sdkit generate`` and this server
write, and what A1111 writes) as A1111's ``parse_generation_parameters`` does: the prompt lines,
``Negative prompt:``, then ``Label: value`` pairs (JSON-quoted values unquoted), ``Size`` also as
``Size-1`` / ``Size-2``. Values stay strings, as there. A1111 then fills in defaults for labels
missing from old images (``Clip skip: 1``...); this server does not invent values.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any

_PAIR = re.compile(r'\s*([\w][\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_SIZE = re.compile(r"^(\d+)x(\d+)$")
NEGATIVE = "Negative prompt:"


def parse_infotext(text: str) -> dict[str, Any]:
    """``{"Prompt": ..., "Negative prompt": ..., "Steps": "20", "Size-1": "512", ...}``."""
    *lines, last = text.strip().split("\n") if text.strip() else [""]
    if len(_PAIR.findall(last)) < 3:  # no parameter line: it was part of the prompt
        lines.append(last)
        last = ""
    prompt: list[str] = []
    negative: list[str] = []
    for line in lines:
        if line.startswith(NEGATIVE) or negative:
            negative.append(line[len(NEGATIVE) :].strip() if line.startswith(NEGATIVE) else line)
        else:
            prompt.append(line)
    result: dict[str, Any] = {"Prompt": "\n".join(prompt).strip(), "Negative prompt": "\n".join(negative).strip()}
    for key, raw in _PAIR.findall(last):
        value = raw.strip()
        if value.startswith('"') and value.endswith('"'):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        size = _SIZE.match(value)
        if size:
            result[f"{key}-1"], result[f"{key}-2"] = size.group(1), size.group(2)
        result[key] = value
    return result


def memory_report() -> dict[str, Any]:
    """A1111's ``MemoryResponse``: ``ram`` (this process's use and the machine's total, bytes)
    and ``cuda`` (``{"error": ...}``: sdkit's backends do not report device memory here)."""
    return {"ram": ram_usage(), "cuda": {"error": "unavailable: sdkit serve does not report device memory"}}


def ram_usage() -> dict[str, Any]:
    if not sys.platform.startswith("linux"):
        return {"error": f"unavailable on {sys.platform}"}
    try:
        with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
            used = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            fields = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in meminfo if line.count(":") == 1}
    except (OSError, StopIteration, ValueError, IndexError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    total = fields.get("MemTotal", 0)
    return {"free": total - used, "used": used, "total": total}  # as A1111: free = total - this process
