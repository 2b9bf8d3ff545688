"""sdkit-ggml's fp16 compute path and flash-attention lowering, each on and off: error against
onnxruntime fp32 and time, in one process, variants rotated per round.

    nice python benchmarks/ggml_fp16.py --cases clip,unet_tiny,vae128 --repeat 3 --threads 1

Variants (``compiler/lowering_modes.py``): ``fp32`` (the default lowering), ``fp32 flash on``
(masked / SDPA attention to flash_attn_ext at fp32 too), ``fp32 flash off``, ``fp16`` (F16
weights, F16 activation products and flash K/V, every attention pattern fused), ``fp16 f16act
off`` (F16 weights and every attention pattern fused, activations F32: the CPU's default),
``fp16 flash off``. Prints per case and
variant the median and min seconds after ``--warmup`` runs, the ratio to ``fp32``, and the
output's relative L2 and max abs difference to onnxruntime fp32, plus the CPU and the load
average before and after (2 shared cores: compare ratios from one run, never seconds across
runs). ``--json`` writes the rows. ``--device cuda:0`` runs the same variants on a CUDA build
of ggml (``SDKIT_GGML_LIB_DIR``); add ``matmul_prec="f32"`` variants there with ``--variants``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import cases  # noqa: E402
import machine  # noqa: E402

import sdkit  # noqa: E402
from sdkit.model import Model, load_onnx  # noqa: E402

VARIANTS: dict[str, dict[str, Any]] = {
    "fp32": {"precision": "fp32"},
    "fp32 flash on": {"precision": "fp32", "flash_attn": "on"},
    "fp32 flash off": {"precision": "fp32", "flash_attn": "off"},
    "fp16": {"precision": "fp16", "f16_activations": "on"},
    "fp16 f16act off": {"precision": "fp16", "f16_activations": "off"},
    "fp16 flash off": {"precision": "fp16", "flash_attn": "off", "f16_activations": "on"},
    "fp16 matmul f32": {"precision": "fp16", "matmul_prec": "f32", "f16_activations": "on"},
}
SWITCHES = ("flash_attn", "f16_activations", "matmul_prec")
DEFAULT_VARIANTS = "fp32,fp32 flash on,fp32 flash off,fp16,fp16 f16act off,fp16 flash off"
SMALL = {
    "clip": ("tiny_clip_text", "CLIP text encoder (tiny config), 1x77 tokens"),
    "unet_tiny": ("tiny_unet", "UNet (tiny config), latent 1x4x32x32, batch 1"),
    "unet_tiny_b2": ("tiny_unet", "UNet (tiny config), latent 2x4x32x32, batch 2 (CFG)"),
    "controlnet": ("tiny_controlnet", "ControlNet (tiny config), latent 1x4x32x32"),
    "vae_encoder": ("sd15_vae_encoder", "SD 1.5 VAE encoder, image 1x3x256x256"),
}


ATTENTION = {  # SD 1.5's first self-attention (320 channels, 8 heads of 40) and its cross-attention
    "attn_self": ((2, 8, 1024, 1024, 40), "SD 1.5 self-attention at 256 px, batch 2 (CFG): 8 heads of 40, 1024 tokens"),
    "attn_cross": ((2, 8, 1024, 77, 40), "SD 1.5 cross-attention at 256 px, batch 2: 1024 queries, 77 keys"),
    "attn_clip": ((2, 12, 77, 77, 64), "CLIP-L self-attention with its causal mask, batch 2: 12 heads of 64"),
}


def attention_graph(shape: tuple[int, ...], causal: bool) -> tuple[Any, dict[str, np.ndarray]]:
    """softmax(Q K^T / sqrt(d) [+ causal mask]) V as torch exports it (a Constant mask, as CLIP's folds to)."""
    from onnx import TensorProto, helper

    b, h, lq, lk, d = shape
    dims = {"q": (b, h, lq, d), "k": (b, h, lk, d), "v": (b, h, lk, d)}
    factor = helper.make_tensor("factor", TensorProto.FLOAT, [], [d**-0.5])
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["raw"]),
        helper.make_node("Constant", [], ["factor"], value=factor),
        helper.make_node("Mul", ["raw", "factor"], ["scores"]),
    ]
    logits = "scores"
    if causal:
        mask = np.triu(np.full((lq, lk), np.finfo(np.float32).min, np.float32), 1)[None, None]
        tensor = helper.make_tensor("m", TensorProto.FLOAT, list(mask.shape), mask.ravel().tolist())
        nodes += [
            helper.make_node("Constant", [], ["m"], value=tensor),
            helper.make_node("Add", ["scores", "m"], ["s2"]),
        ]
        logits = "s2"
    nodes += [helper.make_node("Softmax", [logits], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["out"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(v)) for n, v in dims.items()]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    proto = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    rng = np.random.default_rng(0)
    return proto, {n: rng.standard_normal(v).astype(np.float32) for n, v in dims.items()}


def shipped_attention_graph(latent: int = 32, batch: int = 2) -> tuple[Any, dict[str, np.ndarray]]:
    """The first self-attention of the shipped SD 1.5 UNet graph (``sdkit.families.shipped``),
    cut out as exported: Q, K (before its Transpose) and V [batch*8, latent^2, 40] in, the
    ``Cast(Constant)`` scale and ``ConstantOfShape * Cast(0)`` beta of diffusers' baddbmm."""
    import onnx

    from sdkit.families import shipped

    proto = shipped.load_graph("sd1_unet").proto
    readers: dict[str, list[Any]] = {}
    producer = {o: n for n in proto.graph.node for o in n.output}
    for n in proto.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    pv = readers[readers[softmax.output[0]][0].output[0]][0]  # Softmax -> Cast -> MatMul(P, V)
    node = producer[softmax.input[0]]  # Add(Mul(MatMul(Q, Kt), scale), zeros)
    scores = producer[producer[node.input[0]].input[0]]
    q, kt = scores.input
    k = producer[kt].input[0]
    inputs = [q, k, pv.input[1]]
    keep, todo = set(), [pv.output[0]]
    while todo:  # every node between the three inputs and the output
        node = producer.get(todo.pop())
        if node is not None and id(node) not in keep:
            keep.add(id(node))
            todo += [i for i in node.input if i and i not in inputs]
    graph = onnx.helper.make_graph(
        [n for n in proto.graph.node if id(n) in keep],
        "sd1_unet_attention",
        [onnx.helper.make_tensor_value_info(i, onnx.TensorProto.FLOAT, ["n", "l", 40]) for i in inputs],
        [onnx.helper.make_tensor_value_info(pv.output[0], onnx.TensorProto.FLOAT, None)],
    )
    cut = onnx.helper.make_model(graph, opset_imports=proto.opset_import)
    cut.ir_version = proto.ir_version
    rng = np.random.default_rng(0)
    dims = (batch * 8, latent * latent, 40)
    feeds = {name: rng.standard_normal(dims).astype(np.float32) for name in (q, k, pv.input[1])}
    return cut, feeds


def _batch2(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([v, v * 0.5 if v.dtype.kind == "f" else v]) if v.ndim else v for k, v in feeds.items()}


def load_case(name: str) -> tuple[str, Any, dict[str, np.ndarray]]:
    """Title, model (a path or an in-memory ModelProto) and feeds."""
    if name in ATTENTION:
        shape, title = ATTENTION[name]
        proto, feeds = attention_graph(shape, causal=name == "attn_clip")
        return title, proto, feeds
    if name == "attn_shipped":
        proto, feeds = shipped_attention_graph()
        return "SD 1.5 self-attention as the shipped sd1_unet exports it, 256 px, batch 2", proto, feeds
    if name in SMALL:
        graph, title = SMALL[name]
        feeds = cases.sd_graphs.example_inputs(graph)
        if name.endswith("_b2"):
            feeds = _batch2(feeds)
        return title, Path(cases.sd_graphs.model_path(graph)), feeds
    case = cases.CASES[name]
    return case.title, cases.model_path(case), cases.feeds(case)


def errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)), float(np.max(np.abs(g - w)))


def run_case(name: str, labels: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    import onnxruntime as ort

    title, source, feeds = load_case(name)
    if isinstance(source, Path):
        session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
        model = load_onnx(source)
    else:
        session = ort.InferenceSession(source.SerializeToString(), providers=["CPUExecutionProvider"])
        model = Model.from_proto(source)
    want = session.run(None, feeds)
    del session
    compiled, compile_s = {}, {}
    for label in labels:
        start = time.perf_counter()
        options = {k: v for k, v in VARIANTS[label].items() if k != "precision"}
        compiled[label] = sdkit.compile(
            model,
            backend="ggml",
            device=args.device,
            threads=args.threads,
            precision=VARIANTS[label]["precision"],
            **options,
        )
        compile_s[label] = time.perf_counter() - start
    outputs: dict[str, np.ndarray] = {}
    times: dict[str, list[float]] = {label: [] for label in labels}
    for label in labels:
        for _ in range(args.warmup):
            outputs[label] = next(iter(compiled[label].run(feeds).values()))
    for round_ in range(args.repeat):
        for label in labels[round_ % len(labels) :] + labels[: round_ % len(labels)]:
            start = time.perf_counter()
            outputs[label] = next(iter(compiled[label].run(feeds).values()))
            times[label].append(time.perf_counter() - start)
    rows = []
    base = statistics.median(times[labels[0]])
    for label in labels:
        rel, mx = errors(outputs[label], want[0])
        median = statistics.median(times[label])
        rows.append({"case": name, "title": title, "variant": label, "median_s": median, "min_s": min(times[label]),
                     "ratio": median / base, "rel_l2": rel, "max_abs": mx, "compile_s": compile_s[label],
                     "info": {k: compiled[label].info[k] for k in SWITCHES}})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="attn_self,attn_cross,attn_clip,clip,unet_tiny,unet_tiny_b2")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"of: {', '.join(VARIANTS)}")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="a ggml device: cpu, cuda:0 (a CUDA build of ggml)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    labels = [v.strip() for v in args.variants.split(",") if v.strip()]
    cpu, flags = machine.cpuinfo()
    print(f"CPU: {cpu} ({' '.join(flags)}), device {args.device}, threads {args.threads}, "
          f"load before {machine.load_average()}")  # fmt: skip
    rows = []
    for name in args.cases.split(","):
        for row in run_case(name.strip(), labels, args):
            rows.append(row)
            print(f"{row['case']:>12} {row['variant']:<16} median {row['median_s']:8.3f} s  min {row['min_s']:8.3f} s"
                  f"  x{row['ratio']:.2f}  rel-L2 {row['rel_l2']:.1e}  max {row['max_abs']:.1e}"
                  f"  compile {row['compile_s']:.1f} s", flush=True)  # fmt: skip
    print(f"load after {machine.load_average()}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "flags": flags, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
