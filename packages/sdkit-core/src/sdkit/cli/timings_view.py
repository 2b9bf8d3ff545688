"""The stored timings (``sdkit.timings``) in words: ``sdkit doctor`` lists every record, with
whether it still applies on this machine."""

from __future__ import annotations

from sdkit import tuning
from sdkit._version import __version__
from sdkit.cpu_features import cpu_info
from sdkit.errors import SdkitError
from sdkit.selection import fallback, get_backend
from sdkit.timings import FORMAT, Measurement, TimingsRecord


def fallback_name(name: str) -> bool:
    """Whether backend ``name`` is a fallback (False for one measured then, not installed now)."""
    try:
        return fallback(get_backend(name))
    except SdkitError:
        return False


def staleness(key: dict[str, object]) -> str:
    """``current``, or why a record no longer applies here (it is then never looked up)."""
    why = []
    if key.get("sdkit") != __version__ or key.get("format") != FORMAT:
        why.append("another sdkit version")
    if key.get("backends") != tuning.backend_versions():
        why.append("backends installed, removed or upgraded since")
    if key.get("cpu") != cpu_info().describe():
        why.append("another CPU")
    if key.get("accelerators") != tuning.accelerators():
        why.append("other GPUs/accelerators")
    return "stale, ignored: " + ", ".join(why) if why else "current"


def _result_line(m: Measurement, fastest: float | None, record: TimingsRecord) -> str:
    if not m.ok or m.median_s is None:
        return f"{m.backend}: {m.verdict(record.tolerance, record.first)}"
    if fallback_name(m.backend):
        note = "a fallback, never chosen for speed"
    else:
        note = f"{m.median_s / fastest:.2f}x the fastest" if fastest else ""
    return f"{m.backend} {m.version}: {m.median_s:.4g} s median of {m.runs} on {m.device}, {note}".rstrip(", ")


def _shapes(key: dict[str, object]) -> str:
    shapes = key.get("input_shapes")
    if not isinstance(shapes, dict):
        return "?"
    return " ".join(f"{k}={'x'.join(str(d) for d in v)}" for k, v in shapes.items() if isinstance(v, list))


def stored_timings_lines() -> list[str]:
    """``sdkit doctor``'s view of the stored timings: per model and shapes, each backend's
    median, when and on which machine, and whether the record still applies here."""
    store = tuning.timings_store()
    entries = store.entries()
    lines = [f"timings: {store.folder} ({len(entries)} record(s); `sdkit tune MODEL` adds one)"]
    for path, record in entries:
        if record is None:
            lines.append(f"  {path.name}: unreadable or malformed, ignored (the next tune rewrites it)")
            continue
        key = record.key
        options = key.get("options") if isinstance(key.get("options"), dict) else {}
        model = f"{record.model} " if record.model else ""
        lines.append(
            f"  {model}[{str(key.get('graph', ''))[:12]}] ({_shapes(key)}; device {key.get('device')}; "
            f"{dict(options or {}).get('precision', 'fp32')}): tuned {record.when} on {record.machine}, "
            f"load {' '.join(f'{x:.2f}' for x in record.load) or 'unknown'}; {staleness(key)}"
        )
        ok = sorted((m for m in record.results if m.ok and m.median_s), key=lambda m: m.median_s or 0.0)
        fastest = next((m.median_s for m in ok if not fallback_name(m.backend)), None)
        lines += [f"    {_result_line(m, fastest, record)}" for m in [*ok, *(m for m in record.results if m not in ok)]]
    return lines
