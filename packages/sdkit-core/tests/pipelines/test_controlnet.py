"""ControlNet beyond the diffusers goldens: the guidance window, the residual shapes and the zeros
fed when no ControlNet acts, ControlNets as components (backend per component, offload), loading
and replacing them, and one clear error for each misfit. Tiny SD 1.x pipeline and ControlNets of
``fixtures/tiny_xl``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import sdkit
from sdkit.errors import InputError, ModelFormatError, OptionError
from sdkit.pipelines.features.controlnet import ActiveControl, ControlNet, ControlNetHook, read_controlnet
from sdkit.testing.goldens import GoldenSet, require_backend

ROOT = Path(__file__).resolve().parents[4] / "fixtures" / "tiny_xl"
NETS = ROOT / "controlnet"
GOLDENS = GoldenSet(ROOT)
pytestmark = pytest.mark.skipif(GOLDENS.missing, reason="fixtures/tiny_xl missing")
REQUEST = {"steps": 4, "seed": 9, "guidance_scale": 7.5, "sampler": "euler", "output_type": "np"}


@pytest.fixture(scope="module")
def edges() -> np.ndarray:
    return GOLDENS.array("control_edges")


@pytest.fixture(scope="module")
def pipe() -> Any:
    loaded = sdkit.load_pipeline(ROOT / "sd15", backend="reference", controlnets=[NETS / "sd15_a", NETS / "sd15_b"])
    yield loaded
    loaded.close()


def net(name: str) -> ControlNet:
    _, config = read_controlnet(NETS / name)
    return ControlNet(name, None, config)  # type: ignore[arg-type]


def test_guidance_window_is_diffusers() -> None:
    """``keep = 1 - (i / n < start or (i + 1) / n > end)``: the keeps ``golden.json`` documents
    (README 3.4) for sd15_controlnet_multi and sdxl_controlnet."""
    image = np.zeros((1, 3, 2, 2), np.float32)
    first, second = (ActiveControl(net("sd15_a"), image, s, a, b) for s, a, b in ((1.0, 0.0, 0.75), (0.5, 0.25, 1.0)))
    assert [[first.scale_at(i, 4), second.scale_at(i, 4) / 0.5] for i in range(4)] == [[1, 0], [1, 1], [1, 1], [0, 1]]
    xl = ActiveControl(net("sdxl_a"), image, 0.7, 0.0, 0.5)
    assert [xl.scale_at(i, 4) for i in range(4)] == [0.7, 0.7, 0.0, 0.0]


@pytest.mark.parametrize(("name", "case"), [("sd15_a", "sd15_controlnet"), ("sdxl_a", "sdxl_controlnet")])
def test_residual_shapes_are_the_unets(name: str, case: str) -> None:
    """The zeros' shapes from config.json equal the residuals diffusers fed its UNet."""
    data = GOLDENS.npz()
    keys = sorted(k for k in data if k.startswith(f"{case}/unet0/") and "residual" in k)
    mid = data[f"{case}/unet0/mid_block_additional_residual"]
    expected = [data[k].shape for k in keys if "down" in k] + [mid.shape]
    assert net(name).residual_shapes(2, 16, 24) == expected


def test_no_active_controlnet_is_the_plain_unet(pipe: Any, edges: np.ndarray, monkeypatch: pytest.MonkeyPatch) -> None:
    """At scale 0 no ControlNet runs and ``unet_controlnet`` gets zeros: the image is the plain
    UNet's (txt2img, checked against diffusers in test_golden). Between start and end it runs
    only at the steps it acts."""
    runs: list[int] = []
    original = ControlNetHook.residuals

    def counted(self: ControlNetHook, control: ActiveControl, step: Any) -> list[np.ndarray]:
        runs.append(step.index)
        return original(self, control, step)

    monkeypatch.setattr(ControlNetHook, "residuals", counted)
    plain = pipe.generate("a cat", **REQUEST)
    off = pipe.generate("a cat", **REQUEST, control=[(edges, "sd15_a", 0.0)])
    assert runs == []
    assert float(np.abs(off - plain).max()) <= 1e-5
    late = pipe.generate("a cat", **REQUEST, control=[(edges, "sd15_a", 1.0, 0.5, 1.0)])
    assert runs == [2, 3]
    assert float(np.abs(late - plain).max()) > 1e-3


def test_offload_holds_each_controlnet_once_per_loop(pipe: Any, edges: np.ndarray) -> None:
    offload = sdkit.load_pipeline(ROOT / "sd15", backend="reference", memory="offload", controlnets=NETS / "sd15_a")
    control = [(edges, None, 0.8)]  # None: the only ControlNet loaded
    kept = pipe.generate("a cat", **REQUEST, control=[(edges, "sd15_a", 0.8)])
    assert float(np.abs(offload.generate("a cat", **REQUEST, control=control) - kept).max()) <= 1e-6
    assert offload.components["controlnet:sd15_a"].compiled is None  # released after the loop


def test_controlnet_backend_per_component(edges: np.ndarray) -> None:
    require_backend("openvino")
    mixed = sdkit.load_pipeline(
        ROOT / "sd15", backend={"controlnet": "openvino", "default": "reference"}, controlnets=[NETS / "sd15_a"]
    )
    mixed.generate("a cat", **REQUEST, control=[(edges, "sd15_a", 0.8)])
    backends = mixed.backends()
    assert backends["controlnet:sd15_a"] == "openvino"
    assert backends["unet_controlnet"] == backends["unet"] == "reference"


def test_set_controlnets_replaces_and_names(edges: np.ndarray) -> None:
    loaded = sdkit.load_pipeline(ROOT / "sd15", backend="reference", prepare=False)
    with pytest.raises(InputError, match=r"no ControlNet 'a' \(loaded: none\)"):
        loaded.generate("x", **REQUEST, control=[(edges, "a")])
    loaded.set_controlnets({"a": NETS / "sd15_a", "b": NETS / "sd15_b" / "model.onnx"})
    assert set(loaded.controlnets) == {"a", "b"}
    assert {"controlnet:a", "controlnet:b"} <= set(loaded.components)
    with pytest.raises(InputError, match="names no model"):
        loaded.generate("x", **REQUEST, control=[(edges,)])
    loaded.set_controlnets(None)
    assert loaded.controlnets == {}
    assert not any(name.startswith("controlnet:") for name in loaded.components)
    with pytest.raises(InputError, match="two ControlNets are named 'sd15_a'"):
        loaded.set_controlnets([NETS / "sd15_a", NETS / "sd15_a" / "model.onnx"])


def fake_controlnet(tmp_path: Path, source: str, change: dict[str, Any]) -> Path:
    folder = tmp_path / f"{source}_changed_{len(list(tmp_path.iterdir()))}"
    shutil.copytree(NETS / source, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(change)
    config = {k: v for k, v in config.items() if v is not None or k not in change}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_misfits_are_refused_before_anything_compiles(tmp_path: Path) -> None:
    def attach(path: Any) -> None:
        sdkit.load_pipeline(ROOT / "sd15", backend="reference", prepare=False, controlnets=[path])

    with pytest.raises(ModelFormatError, match="an SDXL ControlNet"):
        attach(NETS / "sdxl_a")
    with pytest.raises(ModelFormatError, match="its conditioning does not fit"):
        attach(fake_controlnet(tmp_path, "sd15_a", {"conditioning_embedding_out_channels": [16, 32, 96, 256]}))
    no_config = tmp_path / "bare"
    no_config.mkdir()
    shutil.copy(NETS / "sd15_a" / "model.onnx", no_config / "model.onnx")
    with pytest.raises(ModelFormatError, match=r"no config\.json"):
        attach(no_config)
    with pytest.raises(ModelFormatError, match=r"not a ControlNet's"):
        attach(fake_controlnet(tmp_path, "sd15_a", {"conditioning_embedding_out_channels": None}))
    with pytest.raises(ModelFormatError, match="not found"):
        attach(tmp_path / "missing")
    with pytest.raises(ModelFormatError, match=r"\.ckpt"):
        attach(tmp_path / "control.ckpt")
    with pytest.raises(ModelFormatError, match="unet_controlnet"):
        sdkit.load_pipeline(ROOT / "sd15_inpaint", backend="reference", prepare=False, controlnets=NETS / "sd15_a")
    with pytest.raises(InputError, match="controlnets must be"):
        sdkit.load_pipeline(ROOT / "sd15", backend="reference", prepare=False, controlnets=3)
    with pytest.raises(InputError, match="given by its folder's path"):
        attach(3)


def test_a_controlnet_whose_inputs_do_not_fit_is_named(tmp_path: Path, edges: np.ndarray) -> None:
    """An SDXL ControlNet whose config hides its family: refused at its first step, by name."""
    disguised = fake_controlnet(tmp_path, "sdxl_a", {"addition_embed_type": None})
    loaded = sdkit.load_pipeline(ROOT / "sd15", backend="reference", controlnets={"x": disguised})
    with pytest.raises(ModelFormatError, match=r"ControlNet 'x' (needs an input|takes encoder_hidden_states)"):
        loaded.generate("x", **REQUEST, control=[(edges, "x")])


def test_controlnets_on_a_pipeline_class_without_them(tiny_dir: Path) -> None:
    class Plain(sdkit.pipelines.Pipeline):
        pass

    from sdkit.pipelines.loaders.loading import attach_controlnets
    from sdkit.pipelines.stages.components import LoadSettings

    with pytest.raises(OptionError, match="takes no ControlNets"):
        attach_controlnets(Plain(None, {}), [NETS / "sd15_a"], LoadSettings())  # type: ignore[arg-type]


@pytest.mark.parametrize("guidance", [7.5, 1.0])
def test_image_i_of_a_batch_is_seed_plus_i(pipe: Any, edges: np.ndarray, guidance: float) -> None:
    """Batches and the unguided batch of N (not 2N) feed the ControlNet its images in step."""
    units = [(edges, "sd15_a", 0.8), (edges, "sd15_b", 0.5)]
    kwargs = {**REQUEST, "steps": 2, "guidance_scale": guidance, "control": units}
    batch = pipe.generate("a cat", **{**kwargs, "num_images": 2})
    second = pipe.generate("a cat", **{**kwargs, "seed": REQUEST["seed"] + 1})
    assert float(np.abs(batch[1] - second[0]).max()) <= 1e-5
