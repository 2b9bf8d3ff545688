"""Tables from a run.py report: per case, the txt2img stages, and a comparison with an earlier run."""

from __future__ import annotations

from typing import Any

ORDER = ("ggml-fp32", "ggml-fp16", "ggml-q8_0", "sdkit-openvino", "openvino", "onnxruntime", "sdcpp")


def engine_order(engine: str) -> tuple[int, str]:
    """Table order: ORDER, with ``ggml-fp32@NAME`` (another ggml build) after its base engine."""
    base = engine.partition("@")[0]
    return (ORDER.index(base) if base in ORDER else len(ORDER), engine)


TITLES = {
    "vae256": "SD 1.5 VAE decoder, latent 1x4x32x32 -> 256 px",
    "vae512": "SD 1.5 VAE decoder, latent 1x4x64x64 -> 512 px",
    "unet256": "SD 1.5 UNet, one step, latent 1x4x32x32, batch 1",
    "unet512": "SD 1.5 UNet, one step, latent 1x4x64x64, batch 1",
    "taef2": "TAEF2 decoder, latent 1x32x64x64 -> 512 px",
}


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows)


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def case_table(case: str, rows: list[dict[str, Any]]) -> str:
    mine = sorted((r for r in rows if r["case"] == case), key=lambda r: engine_order(r["engine"]))
    timed = [r for r in mine if "median_s" in r]
    fastest = min((r["median_s"] for r in timed), default=None)
    peer = next((r["median_s"] for r in timed if r["engine"] == "onnxruntime"), None)
    header = ("engine", "runs", "compile s", "median s", "min s", "x fastest", "x ort", "peak RSS MB",
              "weights MB", "rel-L2 vs ort", "max|diff| vs ort")  # fmt: skip
    table = [header]
    for r in mine:
        if "median_s" not in r:
            table.append((r["engine"], "-", "-", "-", "-", "-", "-", "-", "-", "-", "error: " + r.get("error", "?")))
            continue
        table.append((
            r["engine"], str(len(r["times"])), f"{r['compile_s']:.2f}", f"{r['median_s']:.3f}", f"{r['min_s']:.3f}",
            f"{r['median_s'] / fastest:.2f}" if fastest else "-", f"{r['median_s'] / peer:.2f}" if peer else "-",
            f"{r['peak_rss_mb']:.0f}", _fmt(r.get("weights_mb"), ".0f"), _fmt(r.get("rel_l2"), ".1e"),
            _fmt(r.get("max_diff"), ".1e"),
        ))  # fmt: skip
    return f"\n## {case}: {TITLES.get(case, case)}\n\n" + _table(table)


def txt2img_table(rows: list[dict[str, Any]], steps: int) -> str:
    """sd.cpp's own stage times of one txt2img next to ours composed from the same run's
    unet512 and vae512 medians (2 UNet runs a step: cfg 7; the text encoder is not ours to
    time here: no CLIP-L graph among the fixtures)."""
    by = {(r["case"], r["engine"]): r for r in rows if "median_s" in r}
    lines = [f"\n## txt2img 512x512, {steps} Euler steps, cfg 7\n"]
    sd = by.get(("txt2img", "sdcpp"))
    if sd:
        stage = sd["stages"][0]
        lines.append(
            "stable-diffusion.cpp (its log): text conditioning {condition:.2f} s, sampling {sampling:.2f} s, "
            "decode {decode:.2f} s, generate_image {generate:.2f} s".format(
                **{k: stage.get(k, float("nan")) for k in ("condition", "sampling", "decode", "generate")}
            )
        )
    table = [("engine", "sampling s (2 x steps x unet512)", "decode s (vae512)", "sampling + decode s")]
    for engine in sorted({engine for _, engine in by}, key=engine_order):
        unet, vae = by.get(("unet512", engine)), by.get(("vae512", engine))
        if unet and vae:
            sampling = 2 * steps * unet["median_s"]
            table.append((engine, f"{sampling:.2f}", f"{vae['median_s']:.2f}", f"{sampling + vae['median_s']:.2f}"))
    if sd:
        stage = sd["stages"][0]
        table.append(("sdcpp (measured)", f"{stage.get('sampling', float('nan')):.2f}",
                      f"{stage.get('decode', float('nan')):.2f}",
                      f"{stage.get('sampling', 0) + stage.get('decode', 0):.2f}"))  # fmt: skip
    if len(table) > 1:
        lines.append(_table(table))
    return "\n".join(lines)


def render(report: dict[str, Any], steps: int) -> str:
    info = report["machine"]
    ggml = info.get("ggml_cpu_build", {})
    head = [
        f"# sdkit benchmark: {info['cpu']}, {info['cpus']} cpus, flags {' '.join(info['cpu_flags'])}",
        f"load average before {info['load_before']}, after {info.get('load_after')}; "
        f"threads {report['args']['threads']}",
        "versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        "ggml CPU backend: " + ", ".join(f"{k}={v}" for k, v in ggml.items() if k != "library_dir"),
    ]
    for sd in report.get("sdcpp", [])[:1]:
        if "system_info" in sd:
            head.append(f"stable-diffusion.cpp {sd.get('version')}: {sd['system_info']}")
    cases = [c for c in TITLES if any(r["case"] == c for r in report["results"])]
    body = [case_table(c, report["results"]) for c in cases]
    if any(r["case"] == "txt2img" for r in report["results"]) or "unet512" in cases:
        body.append(txt2img_table(report["results"], steps))
    return "\n".join(head + body)


def compare(rows: list[dict[str, Any]], before: list[dict[str, Any]]) -> str:
    old = {(r["case"], r["engine"]): r for r in before if "median_s" in r}
    table = [("case", "engine", "median s before", "median s now", "now / before")]
    for r in rows:
        prev = old.get((r["case"], r["engine"]))
        if prev and "median_s" in r:
            table.append((r["case"], r["engine"], f"{prev['median_s']:.3f}", f"{r['median_s']:.3f}",
                          f"{r['median_s'] / prev['median_s']:.2f}"))  # fmt: skip
    return "\n## compared with the earlier run\n\n" + _table(table)
