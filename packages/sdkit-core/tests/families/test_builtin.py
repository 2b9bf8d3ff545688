"""The built-in families: their key maps cover every initializer of every shipped graph, their
probes are the graphs' shapes, and their defaults are the published configs.

Oracles: the shipped graphs and ``fixtures/families/manifest.json`` (the torch modules' state
dicts, written by the export script), the LDM facts every converter agrees on (A1111's and
diffusers' single-file code: block numbering, reversed VAE up blocks), the published
``scheduler_config.json`` files, and sdkit's own SD 1.5 scheduler defaults for the folder loader.
"""

from __future__ import annotations

import pytest

from sdkit.families import builtin, shipped
from sdkit.families.family import initializer_specs
from sdkit.plugins import Plugins
from sdkit.schedulers.base import SD15_CONFIG

SHIPPED = set(shipped.names())
CASES = [
    (family.name, component)
    for family in builtin.FAMILIES
    for component, spec in family.components.items()
    if str(spec.graph) in SHIPPED
]


@pytest.mark.parametrize(("family_name", "component"), CASES)
def test_every_shipped_initializer_has_a_key_in_each_layout(family_name: str, component: str) -> None:
    family = next(f for f in builtin.FAMILIES if f.name == family_name)
    specs = initializer_specs(family.components[component].load_graph())
    for layout in family.layouts():
        keys = family.key_map(component, layout)
        assert set(keys) == set(specs)
        ldm = [source.key for source in keys.values()]
        # distinct keys, except OpenCLIP's fused q/k/v (three row slices of one tensor)
        fused = [s for s in keys.values() if s.rows is not None]
        assert len(set(ldm)) == len(ldm) - len(fused) * 2 // 3
        for name, (shape, _) in specs.items():
            if name in family.components[component].probes:
                assert family.components[component].probes[name] == shape, name


# (family, component, graph name, LDM key without the component's namespace)
KNOWN = [
    ("sd1", "unet", "down_blocks.0.attentions.1.proj_in.weight", "input_blocks.2.1.proj_in.weight"),
    ("sd1", "unet", "down_blocks.2.downsamplers.0.conv.weight", "input_blocks.9.0.op.weight"),
    ("sd1", "unet", "up_blocks.0.upsamplers.0.conv.bias", "output_blocks.2.1.conv.bias"),
    ("sd1", "unet", "up_blocks.1.upsamplers.0.conv.bias", "output_blocks.5.2.conv.bias"),
    ("sd1", "unet", "up_blocks.3.resnets.2.conv_shortcut.weight", "output_blocks.11.0.skip_connection.weight"),
    ("sd1", "unet", "mid_block.resnets.1.time_emb_proj.weight", "middle_block.2.emb_layers.1.weight"),
    ("sdxl", "unet", "add_embedding.linear_2.weight", "label_emb.0.2.weight"),
    ("sdxl", "unet", "up_blocks.0.upsamplers.0.conv.weight", "output_blocks.2.2.conv.weight"),
    (
        "sdxl",
        "unet",
        "up_blocks.1.attentions.2.transformer_blocks.1.attn2.to_k.weight",
        "output_blocks.5.1.transformer_blocks.1.attn2.to_k.weight",
    ),
    ("sd1", "vae_decoder", "decoder.up_blocks.0.resnets.0.conv1.weight", "decoder.up.3.block.0.conv1.weight"),
    ("sd1", "vae_decoder", "decoder.up_blocks.3.upsamplers.0.conv.weight", "decoder.up.0.upsample.conv.weight"),
    (
        "sd1",
        "vae_encoder",
        "encoder.mid_block.resnets.1.conv_shortcut.weight",
        "encoder.mid.block_2.nin_shortcut.weight",
    ),
    ("sd1", "vae_encoder", "encoder.conv_norm_out.bias", "encoder.norm_out.bias"),
    ("sd2", "text_encoder", "text_model.embeddings.position_embedding.weight", "positional_embedding"),
    ("sdxl", "text_encoder_2", "text_model.encoder.layers.31.mlp.fc2.bias", "transformer.resblocks.31.mlp.c_proj.bias"),
    ("sdxl_refiner", "text_encoder_2", "text_model.final_layer_norm.weight", "ln_final.weight"),
    (
        "sdxl",
        "text_encoder",
        "text_model.encoder.layers.11.mlp.fc1.weight",
        "text_model.encoder.layers.11.mlp.fc1.weight",
    ),
]
NAMESPACES = {
    ("sd1", "unet"): "model.diffusion_model.",
    ("sdxl", "unet"): "model.diffusion_model.",
    ("sd1", "vae_decoder"): "first_stage_model.",
    ("sd1", "vae_encoder"): "first_stage_model.",
    ("sd2", "text_encoder"): "cond_stage_model.model.",
    ("sdxl", "text_encoder"): "conditioner.embedders.0.transformer.",
    ("sdxl", "text_encoder_2"): "conditioner.embedders.1.model.",
    ("sdxl_refiner", "text_encoder_2"): "conditioner.embedders.0.model.",
}


@pytest.mark.parametrize(("family_name", "component", "name", "key"), KNOWN)
def test_known_ldm_keys(family_name: str, component: str, name: str, key: str) -> None:
    family = next(f for f in builtin.FAMILIES if f.name == family_name)
    expected = NAMESPACES[family_name, component] + key
    assert family.key_map_entry(component, "ldm", name, (1,)).key == expected


def test_openclip_and_vae_transforms() -> None:
    sd2 = builtin.SD2
    v = sd2.key_map_entry("text_encoder", "ldm", "text_model.encoder.layers.3.self_attn.v_proj.bias", (1024,))
    assert (v.key, v.rows) == ("cond_stage_model.model.transformer.resblocks.3.attn.in_proj_bias", (2048, 3072))
    projection = builtin.SDXL.key_map_entry("text_encoder_2", "ldm", "text_projection.weight", (1280, 1280))
    assert projection.transpose and projection.key == "conditioner.embedders.1.model.text_projection"
    q = sd2.key_map_entry("vae_decoder", "ldm", "decoder.mid_block.attentions.0.to_q.weight", (512, 512))
    assert q.reshape and q.key == "first_stage_model.decoder.mid.attn_1.q.weight"
    assert q.stored_shape_fits((512, 512, 1, 1), (512, 512)) and not q.stored_shape_fits((512, 256, 1, 1), (512, 512))
    mapper = sd2.mapper("text_encoder", "ldm")
    assert mapper.ignored("cond_stage_model.model.transformer.resblocks.23.attn.in_proj_weight")  # SD 2.x drops it
    assert mapper.ignored("cond_stage_model.model.text_projection") and mapper.ignored(
        "cond_stage_model.model.logit_scale"
    )
    assert not builtin.SDXL.mapper("text_encoder_2", "ldm").ignored("conditioner.embedders.1.model.text_projection")


def test_defaults_are_the_published_configs() -> None:
    sd15 = {k: v for k, v in builtin.SD1.scheduler_config.items() if not k.startswith("_")}
    assert sd15 == SD15_CONFIG  # what a folder without scheduler config gets: file and folder agree
    assert "timestep_spacing" not in sd15 and builtin.SD1.scheduler_config["_class_name"] == "PNDMScheduler"
    assert builtin.SD2V.scheduler_config["prediction_type"] == "v_prediction"
    assert builtin.SDXL.scheduler_config["timestep_spacing"] == "leading"
    sizes = {
        f.name: (f.sample_size * f.vae_scale_factor, f.vae_scaling_factor, f.prediction_type) for f in builtin.FAMILIES
    }
    assert sizes["sd1"] == (512, 0.18215, "epsilon")
    assert sizes["sd2"] == (512, 0.18215, "epsilon")
    assert sizes["sd2v"] == (768, 0.18215, "v_prediction")
    assert sizes["sdxl"] == sizes["sdxl_refiner"] == (1024, 0.13025, "epsilon")
    assert builtin.SD1.tokenizers["text_encoder"].pad_token == "<|endoftext|>"
    assert builtin.SD2.tokenizers["text_encoder"].pad_token == "!"
    assert builtin.SDXL.tokenizers["text_encoder_2"].pad_token == "!"
    assert builtin.SD2V.priority > builtin.SD2.priority  # a SD 2.x file without .yaml: 768-v, as diffusers


@pytest.mark.parametrize("family", builtin.FAMILIES, ids=lambda f: f.name)
def test_text_outputs_are_graph_outputs(family: object) -> None:
    from sdkit.families import Family

    assert isinstance(family, Family)
    for component, outputs in family.text_outputs.items():
        graph = family.components[component].graph
        if str(graph) in SHIPPED:
            names = {o.name for o in shipped.load_graph(str(graph)).outputs}
            assert set(outputs) <= names, (family.name, component)


def test_registered_by_core() -> None:
    plugins = Plugins([])
    assert [f.name for f in plugins.families.families()] == [
        "sd2v", "flux_dev", "sd1", "sd1_inpaint", "sd2", "sdxl", "sdxl_inpaint", "sdxl_refiner", "flux_schnell",
        "sd3_medium", "sd35_large", "sd35_medium", "chroma", "tiny_digits",
    ]  # fmt: skip
