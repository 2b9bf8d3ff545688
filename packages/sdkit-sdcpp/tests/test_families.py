"""The families only stable-diffusion.cpp runs, from header-only files (real headers, sparse data):
the family each key set names (Wan's version and task too), what ``sdkit inspect`` says, the
pipeline class, and which of sd.cpp's constructor paths the loader hands each file to
(``model_path`` or ``diffusion_model_path``, ``clip_l``/``t5xxl``/``llm``/``clip_vision``/the
high-noise expert), with missing or foreign component files refused naming the keyword."""

from __future__ import annotations

from pathlib import Path

import pytest
from sdcpp_keysets import DENOISERS, WHOLE_EXTRA, header_only

from sdkit.errors import ModelFormatError
from sdkit.families.gguf_reader import family_of
from sdkit_sdcpp.loader import file_family, model_files
from sdkit_sdcpp.pipeline import SdcppFlowPipeline
from sdkit_sdcpp.video import SdcppVideoPipeline, pipeline_class


def _file(tmp_path: Path, family: str, whole: bool = False) -> Path:
    shapes = {**DENOISERS[family], **(WHOLE_EXTRA if whole else {})}
    return header_only(tmp_path / f"{family.replace(' ', '_')}.safetensors", shapes)


@pytest.mark.parametrize("family", list(DENOISERS))
def test_family_from_the_key_set(tmp_path: Path, family: str) -> None:
    path = _file(tmp_path, family)
    assert path.stat().st_blocks * 512 < 1 << 20  # header only: the data is a hole
    assert file_family(path) == family
    expected = SdcppVideoPipeline if family.startswith("Wan") else SdcppFlowPipeline
    assert pipeline_class(family) is expected


def test_wan_in_a_gguf_file_whose_conv3d_weight_is_4d() -> None:
    """GGUF holds at most 4 dims: Wan's [dim, in, 1, 2, 2] patch embedding arrives merged; the
    width comes from a block's query, as sd.cpp counts ``dim * in_channels``."""
    shapes = dict(DENOISERS["Wan2.2 I2V 14B"])
    shapes["model.diffusion_model.patch_embedding.weight"] = (5120 * 36, 1, 2, 2)
    assert family_of(shapes) == "Wan2.2 I2V 14B"


def test_inspect_names_a_wan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from sdkit.cli.main import main

    assert main(["inspect", str(_file(tmp_path, "Wan2.2 TI2V 5B"))]) == 0
    out = capsys.readouterr().out
    assert "Wan2.2 TI2V 5B" in out and "stable-diffusion.cpp" in out


def _components(tmp_path: Path, *names: str) -> dict[str, str]:
    files = {}
    for name in names:
        (tmp_path / f"{name}.safetensors").write_bytes(b"")
        files[name] = str(tmp_path / f"{name}.safetensors")
    return files


@pytest.mark.parametrize(
    ("family", "components"),
    [
        ("FLUX.1", ("clip_l", "t5xxl", "vae")),
        ("FLUX.1 Fill", ("clip_l", "t5xxl", "vae")),
        ("Chroma", ("t5xxl", "vae")),
        ("SD3", ("clip_l", "clip_g", "t5xxl", "vae")),
        ("FLUX.2", ("llm", "vae")),
        ("Qwen-Image", ("llm", "vae")),
        ("Z-Image", ("llm", "vae")),
        ("Wan2.x T2V 1.3B", ("t5xxl", "vae")),
        ("Wan2.1 I2V 14B", ("t5xxl", "clip_vision", "vae")),
        ("Wan2.2 TI2V 5B", ("t5xxl", "vae")),
        ("Wan2.2 I2V 14B", ("t5xxl", "vae", "high_noise_diffusion_model")),
    ],
)
def test_denoiser_files_go_to_diffusion_model_path(tmp_path: Path, family: str, components: tuple[str, ...]) -> None:
    path = _file(tmp_path, family)
    given = _components(tmp_path, *components)
    kwargs = model_files(path, given).constructor_kwargs()
    expected = {"diffusion_model_path": str(path)} | {f"{name}_path": value for name, value in given.items()}
    assert kwargs == expected
    needed = [name for name in components if name != "high_noise_diffusion_model"]
    with pytest.raises(ModelFormatError, match=f"{needed[0]}= .*holds only the {family} denoiser"):
        model_files(path, {k: v for k, v in given.items() if k != needed[0]})


def test_whole_checkpoints_go_to_model_path(tmp_path: Path) -> None:
    sd3 = _file(tmp_path, "SD3", whole=True)
    assert model_files(sd3, {}).constructor_kwargs() == {"model_path": str(sd3)}
    flux = _file(tmp_path, "FLUX.1", whole=True)
    vae = _components(tmp_path, "vae")
    assert model_files(flux, vae).constructor_kwargs() == {"model_path": str(flux), "vae_path": vae["vae"]}


@pytest.mark.parametrize(
    ("family", "foreign"),
    [
        ("FLUX.1", "llm"),
        ("Qwen-Image", "t5xxl"),
        ("Wan2.1 I2V 14B", "high_noise_diffusion_model"),
        ("Wan2.x T2V 14B", "clip_vision"),
        ("FLUX.1", "photo_maker"),
    ],
)
def test_a_component_the_family_does_not_take_is_refused_by_name(tmp_path: Path, family: str, foreign: str) -> None:
    with pytest.raises(ModelFormatError, match=f"{foreign}= .*is a {family} file; it takes"):
        model_files(_file(tmp_path, family), _components(tmp_path, foreign))
