"""The attention pass on graphs exported the way sdkit's shipped family graphs are
(``fixtures/families/graph_export.py``: TorchScript, ``do_constant_folding=False``), against
onnxruntime: the forms those exports write and the pass now reads under ``attention="all"``
(``precision="fp16"`` or ``flash_attn="on"``):

- diffusers' baddbmm attention whose scale and beta=0 are ``Cast(Constant)`` (a Python scalar
  as the TorchScript exporter writes it): SD 1.x/2.x/XL UNets, the VAE's mid-block attention;
- torch SDPA with the scale computed at run time from Q's last dim on rank-4 Q/K/V after RoPE,
  whose ranks shape inference loses (FLUX.1, Chroma).

The fp32 default (``flash_attn="auto"``) still fuses none of them: fp32 results stay bit for
bit what they were. Tolerances as ``test_attention_lowering.py``: relative L2 vs onnxruntime
fp32 1e-5 at fp32 (here the whole graph, fused), 2e-3 at fp16. The fused counts on the
full-size shipped graphs (structure only, no weights) are checked at the end.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import sdkit
from sdkit.families import shipped
from sdkit.model import Model, WeightSet
from sdkit_ggml.compiler.pass_graph import FUSED_DOMAIN
from sdkit_ggml.compiler.passes import apply_passes

ort = pytest.importorskip("onnxruntime")
TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
TOLERANCE = {"fp32": 1e-5, "fp16": 2e-3}


def _model(graph: str, weights: str) -> Model:
    """The graph with its fixture weights as the graph's fp32 (the files hold fp16)."""
    stored = WeightSet.load_safetensors(TINY / weights)
    as_f32 = {
        k: np.asarray(v, np.float32) if np.asarray(v).dtype.kind == "f" else np.asarray(v) for k, v in stored.items()
    }
    return Model(shipped.load_graph(TINY / graph), WeightSet(as_f32))


def _fused(proto: object, patterns: str) -> int:
    nodes = apply_passes(proto, attention=patterns).graph.node  # type: ignore[arg-type]
    return sum(1 for n in nodes if n.domain == FUSED_DOMAIN and n.op_type == "Attention")


def _rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _check(model: Model, feeds: dict[str, np.ndarray], precision: str, flash_attn: str) -> float:
    session = ort.InferenceSession(model.graph.to_onnx(model.weights).SerializeToString())
    want = np.asarray(session.run(None, feeds)[0])
    compiled = sdkit.compile(model, backend="ggml", device="cpu", threads=2, precision=precision, flash_attn=flash_attn)
    got = np.asarray(next(iter(compiled.run(feeds).values())))
    return _rel_l2(got, want)


def _sd1_unet() -> tuple[Model, dict[str, np.ndarray]]:
    rng = np.random.default_rng(31)
    feeds = {
        "sample": rng.standard_normal((2, 4, 8, 6)).astype(np.float32),
        "timestep": np.array([999.0, 501.0], np.float32),
        "encoder_hidden_states": rng.standard_normal((2, 7, 32)).astype(np.float32),
    }
    return _model("sd1/graphs/unet.onnx", "sd1/weights/unet.safetensors"), feeds


def _sdxl_unet() -> tuple[Model, dict[str, np.ndarray]]:
    rng = np.random.default_rng(31)
    feeds = {
        "sample": rng.standard_normal((2, 4, 8, 8)).astype(np.float32),
        "timestep": np.array([999.0, 501.0], np.float32),
        "encoder_hidden_states": rng.standard_normal((2, 7, 80)).astype(np.float32),
        "text_embeds": rng.standard_normal((2, 32)).astype(np.float32),
        "time_ids": np.array([[64, 64, 0, 0, 64, 64]] * 2, np.float32),
    }
    return _model("sdxl/graphs/unet.onnx", "sdxl/weights/unet.safetensors"), feeds


def _vae_decoder() -> tuple[Model, dict[str, np.ndarray]]:
    feeds = {"latent_sample": np.random.default_rng(31).standard_normal((1, 4, 6, 8)).astype(np.float32)}
    return _model("sd1/graphs/vae_decoder.onnx", "sd1/weights/vae_decoder.safetensors"), feeds


def _flux() -> tuple[Model, dict[str, np.ndarray]]:
    rng = np.random.default_rng(31)
    n, image, text = 2, 12, 5
    ids = rng.integers(0, 8, (image + text, 3)).astype(np.float32)
    feeds = {
        "hidden_states": rng.standard_normal((n, image, 64)).astype(np.float32),
        "encoder_hidden_states": rng.standard_normal((n, text, 32)).astype(np.float32),
        "pooled_projections": rng.standard_normal((n, 16)).astype(np.float32),
        "timestep": np.array([0.9, 0.3], np.float32),
        "img_ids": ids[:image],
        "txt_ids": ids[image:],
        "guidance": np.array([3.5, 3.5], np.float32),
    }
    return _model("flux_dynamic/transformer.onnx", "flux_dynamic/weights.safetensors"), feeds


CASES = {
    "sd1_unet (Cast scale and beta)": (_sd1_unet, 12),
    "sdxl_unet (Cast scale and beta)": (_sdxl_unet, 24),
    "vae_decoder (mid-block, Cast scale and beta)": (_vae_decoder, 1),
    "flux (SDPA, rank 4 after RoPE)": (_flux, 7),
}


@pytest.mark.parametrize("case", list(CASES))
def test_forms_fuse_only_under_all(case: str) -> None:
    build, attentions = CASES[case]
    model, _ = build()
    assert _fused(model.graph.proto, "all") == attentions
    assert _fused(model.graph.proto, "plain") == 0  # the fp32 default: as exported, as before


@pytest.mark.parametrize(("precision", "flash_attn"), [("fp16", "auto"), ("fp32", "on")])
@pytest.mark.parametrize("case", list(CASES))
def test_fused_forms_match_onnxruntime(case: str, precision: str, flash_attn: str) -> None:
    model, feeds = CASES[case][0]()
    assert _check(model, feeds, precision, flash_attn) <= TOLERANCE[precision]


# (graph, attention patterns, fused at the fp32 default, fused at fp16 / flash_attn="on"): the
# rows of ``tools/attention_fusion_counts.py`` for the shipped graphs pipelines load (a few
# seconds; SDXL's 140 / 88 and the others are in sdkit-ggml's README table)
SHIPPED = [
    ("sd1_unet", 32, 0, 32),
    ("vae_decoder", 1, 0, 1),
    ("clip_l", 12, 0, 12),
    ("flux_schnell_transformer", 57, 0, 57),
    ("sd3_medium_transformer", 24, 24, 24),
    ("t5xxl_encoder", 24, 0, 24),  # (scores + position bias) + padding mask
]


@pytest.mark.parametrize(("name", "softmaxes", "plain", "every"), SHIPPED, ids=[s[0] for s in SHIPPED])
def test_fused_counts_on_shipped_graphs(name: str, softmaxes: int, plain: int, every: int) -> None:
    proto = shipped.load_graph(name).proto
    assert sum(1 for n in proto.graph.node if n.op_type == "Softmax") == softmaxes
    assert (_fused(proto, "plain"), _fused(proto, "all")) == (plain, every)


def _t5_attention(masked: float) -> tuple[Model, dict[str, np.ndarray]]:
    """T5's encoder attention as the shipped ``t5xxl_encoder`` has it (no tiny graph of this
    export exists: the tiny T5 fixture adds bias and mask before the scores): ``softmax((Q K^T
    + bias) + Where(keep, 0, masked)) V``, rank 4, the bias [1, H, L, L] and the padding mask
    [N, 1, 1, L] graph inputs."""
    n, h, length, d = 2, 4, 9, 16
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Constant", [], ["zero"], value=helper.make_tensor("zero", f, [], [0.0])),
        helper.make_node("Constant", [], ["low"], value=helper.make_tensor("low", f, [], [masked])),
        helper.make_node("Where", ["keep", "zero", "low"], ["mask"]),
        helper.make_node("Add", ["biased", "mask"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["out"]),
    ]
    shapes = {"q": (n, h, length, d), "k": (n, h, length, d), "v": (n, h, length, d), "bias": (1, h, length, length)}
    inputs = [helper.make_tensor_value_info(name, f, shape) for name, shape in shapes.items()]
    inputs.append(helper.make_tensor_value_info("keep", TensorProto.BOOL, (n, 1, 1, length)))
    graph = helper.make_graph(nodes, "t5_attention", inputs, [helper.make_tensor_value_info("out", f, None)])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rng = np.random.default_rng(31)
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    keep = np.ones((n, 1, 1, length), bool)
    keep[1, ..., length - 3 :] = False  # the second prompt padded
    feeds["keep"] = keep
    return Model.from_proto(proto), feeds


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_t5_bias_and_padding_mask(precision: str) -> None:
    """Fused as ``scores + (bias + mask)`` under "all" (equal after softmax for a 0 / finfo.min
    mask), never under "plain"; a mask value that is not masked-or-zero is left as exported."""
    model, feeds = _t5_attention(float(np.finfo(np.float32).min))
    assert (_fused(model.graph.proto, "plain"), _fused(model.graph.proto, "all")) == (0, 1)
    assert _check(model, feeds, precision, "on") <= TOLERANCE[precision]
    soft, _ = _t5_attention(-1.0)
    assert _fused(soft.graph.proto, "all") == 0
