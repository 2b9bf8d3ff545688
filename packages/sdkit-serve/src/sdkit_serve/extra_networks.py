"""The model files a request names beside the checkpoint, in A1111's folders: LoRAs
(``--lora-dir``, A1111's ``models/Lora``: sub-folders, LyCORIS files too), textual-inversion
embeddings (``--embeddings-dir``) and ControlNets (``--controlnet-dir``).

LoRA tags map to files exactly as ``sdkit generate --lora-dir`` maps them
(``sdkit.pipelines.features.lora_embeddings_vae.prompt_loras``: one mapping, containment and
finite strengths checked there). A ControlNet is an sdkit ControlNet folder (``model.onnx`` and
diffusers' ``config.json``), named by its folder's name; a folder whose real path leaves
``--controlnet-dir`` (a link out of it) is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sdkit.errors import InputError, SdkitError, did_you_mean
from sdkit.pipelines.features.lora_embeddings_vae import lora_files, prompt_loras

if TYPE_CHECKING:
    from sdkit_serve.prompt_tags import Tag

LORA_KINDS = ("lora", "lyco")


@dataclass(frozen=True)
class Folders:
    """Where a request's LoRA tags and ControlNet units find their files (None: not served)."""

    lora_dir: Path | None = None
    controlnet_dir: Path | None = None


def tag_loras(prompt: str, tags: list[Tag], folders: Folders | None) -> list[tuple[Path, float]]:
    """The LoRA files and strengths of the prompt's ``<lora:...>``/``<lyco:...>`` tags."""
    if not any(tag.kind.lower() in LORA_KINDS for tag in tags):
        return []
    if folders is None or folders.lora_dir is None:
        raise InputError("the prompt has <lora:...> tags, but this server has no LoRA folder (sdkit serve --lora-dir)")
    return prompt_loras(prompt, folders.lora_dir)


def list_loras(lora_dir: Path | None) -> dict[str, Path]:
    """LoRA name -> file, by stem (A1111's ``/sdapi/v1/loras`` names), for the LoRA folder."""
    if lora_dir is None:
        return {}
    return {name: path for name, path in lora_files(lora_dir).items() if "/" not in name}


def controlnet_folders(controlnet_dir: Path | None) -> dict[str, Path]:
    """ControlNet name -> folder: every folder under ``controlnet_dir`` holding ``model.onnx`` and
    ``config.json``, named by its own name (the first in sorted order wins a shared name)."""
    if controlnet_dir is None:
        return {}
    root = Path(controlnet_dir).resolve()
    found: dict[str, Path] = {}
    for model in sorted(Path(controlnet_dir).rglob("model.onnx")):
        folder = model.parent
        if (folder / "config.json").is_file() and folder.resolve().is_relative_to(root) and folder != controlnet_dir:
            found.setdefault(folder.name, folder)
    return found


def controlnet_name(title: Any, known: dict[str, Path]) -> str:
    """A ControlNet's name from a unit's ``model`` (the extension's titles carry a ``[hash]``)."""
    text = str(title).split(" [")[0].strip()
    if text in known:
        return text
    if "/" in text or "\\" in text or text.startswith(".") or Path(text).is_absolute():
        raise InputError(f"ControlNet model {title!r}: give a name from /controlnet/model_list, not a path")
    offered = ", ".join(known) or "none (sdkit serve --controlnet-dir)"
    raise InputError(f"unknown ControlNet model {title!r}{did_you_mean(text, known)}; models: {offered}")


def load_embeddings(pipe: Any, embeddings_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Load every textual-inversion ``.safetensors`` of ``embeddings_dir`` (sub-folders too) onto
    ``pipe``, as A1111 loads its ``embeddings`` folder; returns A1111's ``/sdapi/v1/embeddings``
    answer: ``{"loaded": {name: info}, "skipped": {name: info}}`` (another family's embedding, a
    pipeline that cannot take embeddings: skipped, with the reason)."""
    answer: dict[str, dict[str, Any]] = {"loaded": {}, "skipped": {}}
    if embeddings_dir is None:
        return answer
    root = Path(embeddings_dir).resolve()
    for path in sorted(Path(embeddings_dir).rglob("*.safetensors")):
        if not path.is_file() or not path.resolve().is_relative_to(root) or path.stem in answer["loaded"]:
            continue
        load = getattr(pipe, "load_embedding", None)
        if load is None:
            answer["skipped"][path.stem] = _embedding_info(None, f"{type(pipe).__name__} loads no embeddings")
            continue
        try:
            load(path)
        except SdkitError as exc:
            answer["skipped"][path.stem] = _embedding_info(None, str(exc))
            continue
        embedding = next(e for e in pipe.adapters.embeddings if e.name == path.stem)
        answer["loaded"][path.stem] = _embedding_info(embedding, None)
    return answer


def _embedding_info(embedding: Any, reason: str | None) -> dict[str, Any]:
    """One entry of A1111's embeddings answer (``step``, ``sd_checkpoint`` and its name are
    training records sdkit does not read: None), plus ``reason`` for a skipped one."""
    shape = vectors = None
    if embedding is not None:
        first = next(iter(embedding.vectors.values()))
        shape, vectors = int(first.shape[-1]), int(embedding.count)
    info: dict[str, Any] = {
        "step": None,
        "sd_checkpoint": None,
        "sd_checkpoint_name": None,
        "shape": shape,
        "vectors": vectors,
    }
    if reason is not None:
        info["reason"] = reason
    return info
