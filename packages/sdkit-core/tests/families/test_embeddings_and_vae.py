"""Textual-inversion embeddings and standalone VAE files against diffusers.

Oracles (``fixtures/families/tiny/<family>/adapters.npz``): diffusers' ``load_textual_inversion``
(token ids of the prompt in ``adapters.json`` and the text encoders' outputs on them) and
``AutoencoderKL.from_single_file`` of each VAE file (encoder and decoder outputs). sdkit's
weights run on the reference backend; required max |diff| <= 1e-4 and identical token ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import sdkit
from sdkit.errors import ModelFormatError
from sdkit.families import Family, MappedCheckpoint, load_checkpoint
from sdkit.families.clip_tokenizer import ClipTokenizerBase
from sdkit.families.embeddings import TOKEN_TABLE, open_embedding
from sdkit.families.vae_file import vae_weights
from sdkit.model import Model, WeightSet
from sdkit.pipelines.features.lora_embeddings_vae import Adapters, GrownTableSource, resized_graph
from sdkit.pipelines.text.clip_tokenizer import make_tokenizer

TINY = Path(__file__).resolve().parents[4] / "fixtures" / "families" / "tiny"
TOLERANCE = 1e-4
FILES = {"sd1": ["skstyle", "skcat"], "sdxl": ["skxlstyle"]}


def _mapped(family: str, tiny: dict[str, Family]) -> MappedCheckpoint:
    return load_checkpoint(TINY / family / f"{family}_fp16.safetensors", list(tiny.values()))


def _goldens(family: str, prefix: str) -> dict[str, np.ndarray]:
    with np.load(TINY / family / "adapters.npz", allow_pickle=False) as data:
        return {k.removeprefix(prefix): data[k] for k in data.files if k.startswith(prefix)}


def _setup(family: str, tiny: dict[str, Family]) -> tuple[MappedCheckpoint, dict[str, ClipTokenizerBase], Adapters]:
    mapped = _mapped(family, tiny)
    adapters = Adapters()
    adapters.embeddings = [
        open_embedding(TINY / family / "embeddings" / f"{name}.safetensors", mapped.family) for name in FILES[family]
    ]
    tokenizers = {c: make_tokenizer(s) for c, s in mapped.family.tokenizers.items()}
    return mapped, tokenizers, adapters


@pytest.mark.parametrize("family", ["sd1", "sdxl"])
def test_embeddings_equal_diffusers_load_textual_inversion(tiny_families: dict[str, Family], family: str) -> None:
    mapped, tokenizers, adapters = _setup(family, tiny_families)
    weights = adapters.component_weights(mapped, tokenizers, {})
    prompts = json.loads((TINY / family / "adapters.json").read_text(encoding="utf-8"))["embedding_prompt"]
    goldens = _goldens(family, "embeddings/")
    for component, info in prompts.items():
        ids = tokenizers[component]([info["prompt"]])
        assert ids.tolist() == goldens[f"{component}/input_ids"].reshape(1, -1).tolist()
        assert sorted(info["added_tokens"].values()) == sorted(
            set(ids[0].tolist()) - set(range(info["tokenizer_len_before"]))
        )
        graph = mapped.family.components[component].load_graph()
        model = Model(graph, mapped.weights[component].updated(weights[component]))
        outputs = sdkit.compile(model, backend="reference").run({"input_ids": ids})
        checked = [k for k in goldens if k.startswith(f"{component}/") and not k.endswith("input_ids")]
        assert len(checked) >= 3
        for key in checked:
            assert np.abs(outputs[key.partition("/")[2]] - goldens[key]).max() <= TOLERANCE, key


@dataclass(frozen=True)
class _Source:
    model: Model

    def describe(self) -> str:
        return "cut"

    def load(self) -> Model:
        return self.model


def test_the_token_table_grows_past_its_end(tiny_families: dict[str, Family]) -> None:
    """With the real vocabulary the table has exactly len(tokenizer) rows and new ids are past
    its end: a tiny text encoder cut to 618 rows, grown again by the embeddings, gives diffusers'
    output (whose own table is 622 rows)."""
    mapped, tokenizers, adapters = _setup("sd1", tiny_families)
    base = mapped.family.components["text_encoder"].load_graph()
    weights = mapped.weights["text_encoder"].entries()
    weights[TOKEN_TABLE] = np.asarray(mapped.weights["text_encoder"][TOKEN_TABLE])[:618]
    cut = _Source(Model(resized_graph(base, {TOKEN_TABLE: (618, 32)}), WeightSet(weights)))
    table = adapters.component_weights(mapped, tokenizers, {})["text_encoder"][TOKEN_TABLE][:622]
    grown = GrownTableSource(cut, 622).load().with_weights({TOKEN_TABLE: table})
    declared = {t.name: list(t.dims) for t in grown.graph.proto.graph.initializer}
    assert declared[TOKEN_TABLE] == [622, 32]
    ids = tokenizers["text_encoder"](["a photo of skstyle and skcat riding a horse"])
    outputs = sdkit.compile(grown, backend="reference").run({"input_ids": ids})
    expected = _goldens("sd1", "embeddings/text_encoder/")
    assert np.abs(outputs["last_hidden_state"] - expected["last_hidden_state"]).max() <= TOLERANCE


def test_embeddings_for_another_model_are_refused(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    sd1 = _mapped("sd1", tiny_families)
    sdxl = _mapped("sdxl", tiny_families)
    with pytest.raises(
        ModelFormatError, match=r"skstyle.safetensors is an embedding for another model: .*text_encoder_2 width 48"
    ):
        open_embedding(TINY / "sd1" / "embeddings" / "skstyle.safetensors", sdxl.family)
    save_file({"emb_params": np.ones((2, 40), np.float16)}, str(tmp_path / "wide.safetensors"))
    with pytest.raises(ModelFormatError, match=r"it has emb_params width 40; tiny sd1 needs text_encoder width 32"):
        open_embedding(tmp_path / "wide.safetensors", sd1.family)
    save_file({"a": np.ones((2, 32), np.float16), "b": np.ones((2, 32), np.float16)}, str(tmp_path / "two.safetensors"))
    with pytest.raises(ModelFormatError, match=r"two.safetensors is not a textual-inversion embedding"):
        open_embedding(tmp_path / "two.safetensors", sd1.family)
    (tmp_path / "emb.pt").write_bytes(b"PK\x03\x04")
    with pytest.raises(ModelFormatError, match=r"pickled checkpoints are refused"):
        open_embedding(tmp_path / "emb.pt", sd1.family)


@pytest.mark.parametrize("file", ["vae_ldm_fp16", "vae_diffusers_fp16"])
def test_standalone_vae_equals_diffusers(tiny_families: dict[str, Family], file: str) -> None:
    mapped = _mapped("sd1", tiny_families)
    weights = vae_weights(TINY / "sd1" / "vae" / f"{file}.safetensors", mapped.family)
    goldens = _goldens("sd1", "")
    with np.load(TINY / "sd1" / "goldens.npz", allow_pickle=False) as base:
        assert np.abs(goldens[f"vae/{file}/vae_decoder/sample"] - base["sd1_fp16/vae_decoder/sample"]).max() > 1e-2
    for component, output, feed in (
        ("vae_encoder", "latent_parameters", "sample"),
        ("vae_decoder", "sample", "latent_sample"),
    ):
        graph = mapped.family.components[component].load_graph()
        compiled = sdkit.compile(Model(graph, weights[component]), backend="reference")
        result = compiled.run({feed: goldens[f"sd1/inputs/{component}/{feed}"]})[output]
        assert np.abs(result - goldens[f"vae/{file}/{component}/{output}"]).max() <= TOLERANCE


def test_a_vae_file_that_is_no_vae_is_refused(tiny_families: dict[str, Family], tmp_path: Path) -> None:
    mapped = _mapped("sd1", tiny_families)
    with pytest.raises(ModelFormatError, match=r"sd1_kohya_attn.safetensors is not a VAE for tiny sd1"):
        vae_weights(TINY / "sd1" / "lora" / "sd1_kohya_attn.safetensors", mapped.family)
    data = (TINY / "sd1" / "vae" / "vae_ldm_fp16.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match=r"cut.safetensors is truncated"):
        vae_weights(tmp_path / "cut.safetensors", mapped.family)
