"""PipelineConfig: one value object, read from a diffusers folder today (folder_config)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sdkit.errors import ModelFormatError
from sdkit.pipelines import PipelineConfig
from sdkit.pipelines.loaders.diffusers_folder import folder_config, read_folder


def test_the_tiny_folder(tiny_dir: Path) -> None:
    config = folder_config(read_folder(tiny_dir))
    assert config.name == "model"
    assert config.prediction_type == "epsilon"
    assert config.latent_channels == 4
    assert config.vae_scaling_factor == pytest.approx(0.18215)
    assert config.vae_scale_factor == 2  # two VAE blocks in the tiny test VAE
    assert config.sample_size == 32 and config.default_size == 64
    assert config.size_multiple == 8
    assert config.scheduler_config is not None and config.scheduler_config["beta_schedule"] == "scaled_linear"
    assert config.tokenizers == {"text_encoder": tiny_dir / "tokenizer"}
    assert config.text_outputs == {"text_encoder": ("last_hidden_state",)}
    assert config.latent_shape(2, 32, 48) == (2, 4, 24, 16)


def test_sd_defaults_where_the_folder_is_silent(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    for component in ("unet", "vae_decoder", "vae_encoder"):
        (copy / component / "config.json").unlink()
    (copy / "scheduler" / "scheduler_config.json").write_text(json.dumps({"prediction_type": "v_prediction"}))
    config = folder_config(read_folder(copy))
    assert (config.vae_scale_factor, config.sample_size, config.default_size) == (8, 64, 512)
    assert config.vae_scaling_factor == pytest.approx(0.18215)
    assert config.prediction_type == "v_prediction"


def test_bad_values_are_one_model_format_error(tiny_dir: Path, tmp_path: Path) -> None:
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    path = copy / "vae_decoder" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "scaling_factor": "big"}))
    with pytest.raises(ModelFormatError, match="scaling_factor"):
        folder_config(read_folder(copy))
    with pytest.raises(ModelFormatError, match=r"prediction_type 'sample'.*latent_channels 0"):
        PipelineConfig(name="x", prediction_type="sample", latent_channels=0)


@pytest.mark.parametrize(
    ("config", "key", "value", "match"),
    [
        ("unet", "sample_size", [], "sample_size"),  # was an IndexError, "internal error"
        ("unet", "sample_size", "64", "sample_size"),  # was a 12x12 image
        ("vae_decoder", "scaling_factor", "abc", "scaling_factor"),
        ("vae_decoder", "scaling_factor", 0, "vae_scaling_factor 0"),  # ran silently
    ],
)
def test_bad_numbers_in_configs_are_refused(
    config: str, key: str, value: object, match: str, tiny_dir: Path, tmp_path: Path
) -> None:
    """Issue 15 finding 8."""
    copy = tmp_path / "pipe"
    shutil.copytree(tiny_dir, copy)
    path = copy / config / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ModelFormatError, match=match):
        folder_config(read_folder(copy))
