"""Which family a file is, and what it predicts: the option beats the A1111 ``.yaml`` beside the
file, which beats the family's default; among families sharing their tensors (SD 2.x 512-eps and
768-v) the prediction picks, else the higher priority (768-v, as diffusers reads SD 2.x files)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sdkit.errors import ModelFormatError, OptionError
from sdkit.families import Checkpoint, Family, detect, normalize_prediction
from sdkit.families.builtin import FAMILIES as BUILTIN


@pytest.fixture
def sd2_copy(tiny_families_dir: Path, tmp_path: Path) -> Path:
    """The tiny SD 2.x v-prediction file without its .yaml."""
    return Path(shutil.copy(tiny_families_dir / "sd2v" / "sd2v_fp16.safetensors", tmp_path / "model.safetensors"))


def _detect(path: Path, families: dict[str, Family], prediction: str | None = None) -> tuple[str, str, str]:
    found = detect(Checkpoint.open(path), sorted(families.values(), key=lambda f: -f.priority), prediction)
    return found.family.name, found.prediction_type, found.prediction_from


def test_the_yaml_beside_the_file_says_v(tiny_families: dict[str, Family], tiny_families_dir: Path) -> None:
    assert _detect(tiny_families_dir / "sd2v" / "sd2v_bf16.safetensors", tiny_families) == (
        "tiny_sd2v",
        "v_prediction",
        "yaml",
    )


def test_without_yaml_the_higher_priority_family(tiny_families: dict[str, Family], sd2_copy: Path) -> None:
    assert _detect(sd2_copy, tiny_families) == ("tiny_sd2v", "v_prediction", "family")
    assert _detect(sd2_copy, tiny_families, "eps") == ("tiny_sd2", "epsilon", "option")


def test_a_yaml_without_parameterization_is_epsilon(tiny_families: dict[str, Family], sd2_copy: Path) -> None:
    sd2_copy.with_suffix(".yaml").write_text("model:\n  params:\n    linear_start: 0.00085\n", encoding="utf-8")
    assert _detect(sd2_copy, tiny_families) == ("tiny_sd2", "epsilon", "yaml")
    assert _detect(sd2_copy, tiny_families, "v") == ("tiny_sd2v", "v_prediction", "option")


def test_a_prediction_no_family_has_overrides_the_first(
    tiny_families: dict[str, Family], tiny_families_dir: Path
) -> None:
    # a v-prediction SD 1.x fine-tune: the SD 1.x family, read as v
    assert _detect(tiny_families_dir / "sd1" / "sd1_fp16.safetensors", tiny_families, "v") == (
        "tiny_sd1",
        "v_prediction",
        "option",
    )


def test_bad_yaml_and_bad_option(tiny_families: dict[str, Family], sd2_copy: Path) -> None:
    sd2_copy.with_suffix(".yaml").write_text("model: [unclosed", encoding="utf-8")
    with pytest.raises(ModelFormatError, match=r"model.yaml is not a readable YAML config"):
        _detect(sd2_copy, tiny_families)
    sd2_copy.with_suffix(".yaml").write_text("model:\n  params:\n    parameterization: x0\n", encoding="utf-8")
    with pytest.raises(ModelFormatError, match="parameterization 'x0' is not supported"):
        _detect(sd2_copy, tiny_families)
    with pytest.raises(OptionError, match="unknown prediction type 'sample'"):
        normalize_prediction("sample")


def test_yaml_is_never_turned_into_objects(tiny_families: dict[str, Family], sd2_copy: Path) -> None:
    sd2_copy.with_suffix(".yaml").write_text("model: !!python/object/apply:os.system ['echo hi']\n", encoding="utf-8")
    with pytest.raises(ModelFormatError, match="not a readable YAML config"):
        _detect(sd2_copy, tiny_families)


def test_builtin_families_do_not_claim_tiny_files(tiny_families_dir: Path) -> None:
    for path in sorted(tiny_families_dir.glob("*/*.safetensors")):
        checkpoint = Checkpoint.open(path)
        assert [f.name for f in BUILTIN if f.detect(checkpoint)] == [], path.name
