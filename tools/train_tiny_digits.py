"""Train ``tiny_digits``: a small text-conditioned latent diffusion model on scikit-learn's digits.

Dev-only (torch, diffusers, transformers, scikit-learn, safetensors; nothing is downloaded).
The model is Stable Diffusion's architecture at small size (diffusers ``AutoencoderKL``,
``UNet2DConditionModel``, transformers ``CLIPTextModel`` read by sdkit's shipped CLIP BPE
tokenizer), trained from scratch on the 1,797 8x8 images of ``sklearn.datasets.load_digits``
upsampled to 32 px and augmented, with captions such as "a handwritten digit seven". Run from
the repository root (the model card in ``models/tiny-digits/README.md`` has the exact command
and what it printed)::

    nice /work/devvenv/bin/python tools/train_tiny_digits.py train --out /tmp/tiny-digits
    nice /work/devvenv/bin/python tools/train_tiny_digits.py export --out /tmp/tiny-digits

``train`` writes the diffusers components and ``train.json`` (losses, wall times, versions);
``export`` writes ``models/tiny-digits/tiny_digits.safetensors`` in the LDM single-file key
layout (``fixtures/families/ldm_writer.py``, the converter the tiny test families are proven
with by diffusers' ``from_single_file``), fp16, and checks it with diffusers' own single-file
loader; ``graphs`` writes the weightless ONNX graphs sdkit ships for the family.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.resources
import importlib.util
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SDKIT_SRC = ROOT / "packages" / "sdkit-core" / "src" / "sdkit"
sys.path.insert(0, str(ROOT / "fixtures" / "families"))

import configs as C  # noqa: E402

SEED = 20251128
SIZE = 32  # pixels
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
TEMPLATES = (
    "a handwritten digit {word}",
    "a handwritten {d}",
    "a handwritten digit {d}",
    "the number {word}",
    "the digit {d}",
    "handwritten {word}",
    "{word}",
    "{d}",
    "a drawing of the number {d}",
    "the handwritten number {word}",
)
CAPTION_DROPOUT = 0.1
T0 = time.time()  # empty prompt, so classifier-free guidance has an unconditional model

# --- architecture: fixtures/families/configs.py (TINY_DIGITS_*), which the shipped graphs use ----

TEXT, UNET, VAE = C.TINY_DIGITS_TEXT, C.TINY_DIGITS_UNET, C.TINY_DIGITS_VAE
SCHEDULER: dict[str, Any] = {  # SD 1.5's betas, so every SD sampler applies
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
}


# --- the tokenizer sdkit ships (imported without the sdkit package's runtime dependencies) -----


def clip_tokenizer() -> Any:
    for name, path in (("sdkit", SDKIT_SRC), ("sdkit.families", SDKIT_SRC / "families")):
        if name not in sys.modules:
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(path)]
            sys.modules[name] = importlib.util.module_from_spec(spec)
    files = importlib.resources.files
    importlib.resources.files = lambda p: SDKIT_SRC / "families" if p == "sdkit.families" else files(p)  # type: ignore[assignment,return-value]
    from sdkit.families.clip_tokenizer import CLIP_VOCAB

    return CLIP_VOCAB.tokenizer()


def captions() -> tuple[list[list[str]], np.ndarray]:
    """Per digit, its captions; and the token ids of every caption (digit-major) plus ""."""
    per_digit = [[t.format(word=WORDS[d], d=d) for t in TEMPLATES] for d in range(10)]
    flat = [c for cs in per_digit for c in cs] + [""]
    return per_digit, np.asarray(clip_tokenizer()(flat), dtype=np.int64)


# --- data ---------------------------------------------------------------------------------------


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    data = load_digits()
    ink = torch.from_numpy(data.images.astype(np.float32) / 16.0)[:, None]  # [N,1,8,8], 1 = ink
    return ink, torch.from_numpy(data.target.astype(np.int64))


def render(ink8: torch.Tensor, gen: torch.Generator, augment: bool = True) -> torch.Tensor:
    """8x8 ink -> 32 px RGB in [-1, 1], dark ink on white; random rotation, scale and shift."""
    n = ink8.shape[0]
    ink = F.interpolate(ink8, size=(SIZE, SIZE), mode="bicubic", align_corners=False).clamp(0, 1)
    if augment:
        angle = (torch.rand(n, generator=gen) * 2 - 1) * math.radians(12)
        scale = 1.0 + (torch.rand(n, generator=gen) * 2 - 1) * 0.12
        shift = (torch.rand(n, 2, generator=gen) * 2 - 1) * 0.12
        cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, [n, 1, SIZE, SIZE], align_corners=False)
        ink = F.grid_sample(ink, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return (1.0 - 2.0 * ink).repeat(1, 3, 1, 1)


def to_8x8(images: np.ndarray) -> np.ndarray:
    """[N,3,32,32] in [-1, 1] (dark ink on white) -> [N,64] on load_digits' 0-16 ink scale."""
    ink = (1.0 - images.mean(axis=1)) / 2.0
    n = ink.shape[0]
    return np.clip(ink.reshape(n, 8, SIZE // 8, 8, SIZE // 8).mean(axis=(2, 4)) * 16.0, 0, 16).reshape(n, 64)


# --- models -------------------------------------------------------------------------------------


def build() -> tuple[Any, Any, Any]:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    cfg = CLIPTextConfig(**TEXT)
    cfg._attn_implementation = "eager"
    return AutoencoderKL(**VAE), UNet2DConditionModel(**UNET), CLIPTextModel(cfg)


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_vae(vae: Any, ink: torch.Tensor, steps: int, batch: int, log: list[dict[str, float]]) -> None:
    gen = torch.Generator().manual_seed(SEED + 1)
    opt = torch.optim.AdamW(vae.parameters(), lr=2e-3, weight_decay=0.0)
    vae.train()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, 2e-3)
        idx = torch.randint(0, ink.shape[0], (batch,), generator=gen)
        x = render(ink[idx], gen)
        posterior = vae.encode(x).latent_dist
        z = posterior.mean + posterior.std * torch.randn(posterior.mean.shape, generator=gen)
        recon = vae.decode(z).sample
        rec = F.mse_loss(recon, x)
        kl = posterior.kl().mean() / (4 * (SIZE // 4) ** 2)
        loss = rec + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            log.append({"step": step, "rec": float(rec.detach()), "kl": float(kl.detach())})
            print(f"vae {step:5d} rec {float(rec):.5f} kl {float(kl):.3f} {time.time() - T0:.0f}s", flush=True)
    vae.eval()


@torch.no_grad()
def latent_scale(vae: Any, ink: torch.Tensor) -> float:
    gen = torch.Generator().manual_seed(SEED + 2)
    z = torch.cat([vae.encode(render(ink[i : i + 256], gen)).latent_dist.mean for i in range(0, len(ink), 256)])
    return float(1.0 / z.std())


def train_unet(
    vae: Any, unet: Any, text: Any, ink: torch.Tensor, labels: torch.Tensor, args: argparse.Namespace, log: list
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Epsilon prediction on SD's schedule, min-SNR-5 weighting, EMA of the weights."""
    from diffusers import DDPMScheduler

    _, ids = captions()
    ids_t = torch.from_numpy(ids)
    n_templates = len(TEMPLATES)
    sched = DDPMScheduler(**SCHEDULER)
    alphas = sched.alphas_cumprod
    snr = alphas / (1 - alphas)
    weight = torch.clamp(snr, max=5.0) / snr
    gen = torch.Generator().manual_seed(SEED + 3)
    params = [*unet.parameters(), *text.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=1e-2)
    ema = {f"unet.{k}": v.detach().clone() for k, v in unet.state_dict().items()}
    ema.update({f"text.{k}": v.detach().clone() for k, v in text.state_dict().items()})
    unet.train()
    text.train()
    running = 0.0
    for step in range(args.unet_steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.unet_steps, args.lr)
        idx = torch.randint(0, ink.shape[0], (args.batch,), generator=gen)
        with torch.no_grad():
            post = vae.encode(render(ink[idx], gen)).latent_dist
            z = (post.mean + post.std * torch.randn(post.mean.shape, generator=gen)) * args.scale
        template = torch.randint(0, n_templates, (args.batch,), generator=gen)
        row = labels[idx] * n_templates + template
        drop = torch.rand(args.batch, generator=gen) < CAPTION_DROPOUT
        row = torch.where(drop, torch.full_like(row, len(ids) - 1), row)
        states = text(input_ids=ids_t[row]).last_hidden_state
        t = torch.randint(0, 1000, (args.batch,), generator=gen)
        noise = torch.randn(z.shape, generator=gen)
        noisy = sched.add_noise(z, noise, t)
        pred = unet(noisy, t, states).sample
        loss = ((pred - noise) ** 2).mean(dim=(1, 2, 3))
        loss = (loss * weight[t]).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for prefix, module in (("unet.", unet), ("text.", text)):
                for k, v in module.state_dict().items():
                    if v.is_floating_point():
                        ema[prefix + k].mul_(decay).add_(v.detach(), alpha=1 - decay)
        running = float(loss) if step == 0 else 0.98 * running + 0.02 * float(loss)
        if step % 50 == 0 or step == args.unet_steps - 1:
            log.append({"step": step, "loss": float(loss), "loss_avg": running})
            print(
                f"unet {step:5d} loss {float(loss):.4f} avg {running:.4f} "
                f"lr {lr_at(step, args.unet_steps, args.lr):.2e} {time.time() - T0:.0f}s",
                flush=True,
            )
    unet.eval()
    text.eval()
    unet_sd = {k[5:]: v for k, v in ema.items() if k.startswith("unet.")}
    text_sd = {k[5:]: v for k, v in ema.items() if k.startswith("text.")}
    return unet_sd, text_sd


# --- checking in torch (the shipped file is checked by sdkit's own test on each backend) --------


@torch.no_grad()
def sample(
    vae: Any, unet: Any, text: Any, scale: float, prompts: list[str], seed: int, steps: int = 20, cfg: float = 5.0
) -> np.ndarray:
    from diffusers import DDIMScheduler

    ids = torch.from_numpy(np.asarray(clip_tokenizer()([*prompts, ""]), dtype=np.int64))
    states = text(input_ids=ids).last_hidden_state
    cond, uncond = states[:-1], states[-1:].expand(len(prompts), -1, -1)
    sched = DDIMScheduler(**SCHEDULER, clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    sched.set_timesteps(steps)
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn((len(prompts), 4, SIZE // 4, SIZE // 4), generator=gen)
    for t in sched.timesteps:
        eps = unet(torch.cat([z, z]), t, torch.cat([uncond, cond])).sample
        e_u, e_c = eps.chunk(2)
        z = sched.step(e_u + cfg * (e_c - e_u), t, z).prev_sample
    return vae.decode(z / scale).sample.clamp(-1, 1).numpy()


def classifier() -> Any:
    from sklearn.datasets import load_digits
    from sklearn.svm import SVC

    data = load_digits()
    return SVC(gamma=0.001).fit(data.data, data.target)


def evaluate(vae: Any, unet: Any, text: Any, scale: float, seeds: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    clf = classifier()
    prompts = [f"a handwritten digit {w}" for w in WORDS]
    results = {}
    for seed in seeds:
        pred = clf.predict(to_8x8(sample(vae, unet, text, scale, prompts, seed)))
        results[str(seed)] = [int(p) for p in pred]
    correct = sum(int(p == d) for preds in results.values() for d, p in enumerate(preds))
    return {"predictions": results, "correct": correct, "of": 10 * len(seeds)}


# --- commands -----------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> None:
    import diffusers
    import sklearn
    import transformers

    torch.manual_seed(SEED)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ink, labels = digits()
    vae, unet, text = build()
    info: dict[str, Any] = {
        "seed": SEED,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "diffusers": diffusers.__version__,
            "transformers": transformers.__version__,
            "scikit-learn": sklearn.__version__,
        },
        "cpu": _cpu_name(),
        "threads": args.threads,
        "parameters": {
            name: sum(p.numel() for p in m.parameters())
            for name, m in (("vae", vae), ("unet", unet), ("text_encoder", text))
        },
        "args": vars(args),
    }
    print(json.dumps(info["parameters"]), flush=True)
    vae_log: list[dict[str, float]] = []
    start = time.time()
    if args.vae_from:
        from diffusers import AutoencoderKL

        vae = AutoencoderKL.from_pretrained(Path(args.vae_from) / "vae")
        info["vae_from"] = args.vae_from
    else:
        train_vae(vae, ink, args.vae_steps, args.vae_batch, vae_log)
    info["vae_seconds"] = round(time.time() - start, 1)
    vae.requires_grad_(False)
    scale = latent_scale(vae, ink)
    args.scale = round(scale, 4)
    info["scaling_factor"] = args.scale
    print(f"latent scaling factor {args.scale}", flush=True)
    vae.register_to_config(scaling_factor=args.scale)
    vae.save_pretrained(out / "vae")
    unet_log: list[dict[str, float]] = []
    start = time.time()
    unet_sd, text_sd = train_unet(vae, unet, text, ink, labels, args, unet_log)
    info["unet_seconds"] = round(time.time() - start, 1)
    unet.load_state_dict(unet_sd)
    text.load_state_dict(text_sd)
    unet.save_pretrained(out / "unet")
    text.save_pretrained(out / "text_encoder")
    info["vae_log"], info["unet_log"] = vae_log, unet_log
    info["eval"] = evaluate(vae, unet, text, args.scale)
    print("eval", json.dumps(info["eval"]), flush=True)
    (out / "train.json").write_text(json.dumps(info, indent=1) + "\n")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def load_trained(out: Path) -> tuple[Any, Any, Any]:
    from diffusers import AutoencoderKL, UNet2DConditionModel
    from transformers import CLIPTextModel

    return (
        AutoencoderKL.from_pretrained(out / "vae").eval(),
        UNet2DConditionModel.from_pretrained(out / "unet").eval(),
        CLIPTextModel.from_pretrained(out / "text_encoder").eval(),
    )


def cmd_eval(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    vae, unet, text = load_trained(Path(args.out))
    print(json.dumps(evaluate(vae, unet, text, float(vae.config.scaling_factor), tuple(range(args.seeds)))))


CHECKPOINT = ROOT / "models" / "tiny-digits" / "tiny_digits.safetensors"
TOKENIZER = ROOT / "fixtures" / "tiny_pipeline" / "model" / "tokenizer"  # config only (from_single_file)


def ldm_arrays(vae: Any, unet: Any, text: Any) -> dict[str, np.ndarray]:
    """The trained modules in the LDM single-file layout (``ldm_writer``, the converter the tiny
    test families are proven with), plus the DDPM buffers CompVis files carry."""
    import graph_export as ge
    import ldm_writer as W

    def numpy(state: Any) -> dict[str, np.ndarray]:
        return {k: v.detach().float().numpy() for k, v in state.items()}

    out = W.unet_to_ldm(numpy(unet.state_dict()), UNET)
    out.update(W.vae_to_ldm(numpy(vae.state_dict()), VAE))
    out.update(W.clip_to_ldm(numpy(ge.Component("clip", text).state_dict()), "cond_stage_model.transformer."))
    out.update(W.ddpm_buffers())
    return out


def check_with_diffusers(path: Path, vae: Any, unet: Any, text: Any) -> int:
    """diffusers' own single-file loader (the independent oracle) reads back every tensor of the
    three modules exactly as the fp16-rounded originals; returns the count."""
    import tempfile

    from diffusers import DDIMScheduler, StableDiffusionPipeline
    from transformers import CLIPTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        StableDiffusionPipeline(
            vae=vae,
            text_encoder=text,
            tokenizer=CLIPTokenizer.from_pretrained(str(TOKENIZER)),
            unet=unet,
            scheduler=DDIMScheduler(**SCHEDULER),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        ).save_pretrained(tmp)
        for weights in Path(tmp).rglob("*.safetensors"):
            weights.unlink()  # the configuration only
        pipe = StableDiffusionPipeline.from_single_file(
            str(path), config=tmp, local_files_only=True, torch_dtype=torch.float32, safety_checker=None
        )
    count = 0
    for name, module in (("unet", unet), ("vae", vae), ("text_encoder", text)):
        got = getattr(pipe, name).state_dict()
        want = module.state_dict()
        if set(got) != set(want):
            raise RuntimeError(f"{name}: keys differ: {sorted(set(got) ^ set(want))[:5]}")
        for key, value in want.items():
            expected = value.half().float() if value.is_floating_point() else value
            if not torch.equal(expected, got[key].float() if got[key].is_floating_point() else got[key]):
                raise RuntimeError(f"{name}.{key}: from_single_file read other values")
            count += 1
    return count


def cmd_export(args: argparse.Namespace) -> None:
    from safetensors.torch import save_file

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    vae, unet, text = load_trained(out)
    tensors = {}
    for key, value in ldm_arrays(vae, unet, text).items():
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        tensors[key] = tensor.half() if tensor.is_floating_point() else tensor
    target = Path(args.checkpoint)
    target.parent.mkdir(parents=True, exist_ok=True)
    info = json.loads((out / "train.json").read_text())
    meta = {
        "format": "pt",
        "modelspec.title": "tiny_digits",
        "modelspec.architecture": "tiny_digits (stable-diffusion-v1 architecture at small size)",
        "modelspec.description": "Trained on scikit-learn's load_digits (UCI handwritten digits) "
        "by sdkit's tools/train_tiny_digits.py",
        "modelspec.license": "BSD-3-Clause (sdkit); data: UCI Optical Recognition of Handwritten Digits, CC BY 4.0",
        "tiny_digits.scaling_factor": str(info["scaling_factor"]),
    }
    save_file(tensors, str(target), metadata=meta)
    target.chmod(0o644)
    checked = check_with_diffusers(target, vae, unet, text)
    print(
        f"{target}: {target.stat().st_size / 1e6:.2f} MB, {len(tensors)} tensors; "
        f"diffusers from_single_file read back {checked} exactly"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train")
    train.add_argument("--out", required=True)
    train.add_argument("--vae-steps", type=int, default=800)
    train.add_argument("--vae-batch", type=int, default=32)
    train.add_argument("--vae-from", default="", help="reuse the VAE of an earlier run's --out")
    train.add_argument("--unet-steps", type=int, default=4000)
    train.add_argument("--batch", type=int, default=64)
    train.add_argument("--lr", type=float, default=1e-3)
    train.add_argument("--ema", type=float, default=0.999)
    train.add_argument("--threads", type=int, default=2)
    ev = sub.add_parser("eval")
    ev.add_argument("--out", required=True)
    ev.add_argument("--seeds", type=int, default=3)
    ev.add_argument("--threads", type=int, default=2)
    exp = sub.add_parser("export")
    exp.add_argument("--out", required=True)
    exp.add_argument("--checkpoint", default=str(CHECKPOINT))
    exp.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    {"train": cmd_train, "eval": cmd_eval, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    main()
