"""Plugin loading: isolation, strict mode, disabling, duplicates, unknown hooks, import-light
hook modules, and the hook specs themselves."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdkit.errors import PluginLoadError
from sdkit.plugins import Plugins
from sdkit.plugins import hookspecs as specs_module
from sdkit.reference import ReferenceBackend


def _module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    sys.modules[name] = module
    return module


@pytest.fixture
def fake_modules() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        sys.modules.pop(name, None)


def _ep(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group="sdkit")


GOOD = """
from sdkit.plugins import hookimpl
from sdkit.reference import ReferenceBackend

class GoodBackend(ReferenceBackend):
    name = "good"
    priority = 5

@hookimpl
def sdkit_register_backends(registry):
    registry.add(GoodBackend)
"""


def test_broken_plugin_is_recorded_and_others_load(fake_modules: list[str]) -> None:
    _module("fake_good", GOOD)
    fake_modules += ["fake_good"]
    plugins = Plugins([_ep("broken", "fake_missing_module_xyz"), _ep("good", "fake_good")])
    assert "good" in plugins.backends.names()
    assert "reference" in plugins.backends.names()
    [failure] = plugins.failures
    assert failure.name == "broken" and failure.stage == "import"
    assert "fake_missing_module_xyz" in failure.error


def test_strict_mode_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SDKIT_STRICT_PLUGINS", "1")
    with pytest.raises(PluginLoadError, match="broken"):
        Plugins([_ep("broken", "fake_missing_module_xyz")])


def test_disabled_plugins_are_skipped(monkeypatch: pytest.MonkeyPatch, fake_modules: list[str]) -> None:
    _module("fake_good", GOOD)
    fake_modules += ["fake_good"]
    monkeypatch.setenv("SDKIT_DISABLE_PLUGINS", "good, other")
    plugins = Plugins([_ep("good", "fake_good")])
    assert "good" not in plugins.backends.names()
    assert plugins.disabled == ["good"]


def test_duplicate_backend_name_names_both_plugins(fake_modules: list[str]) -> None:
    _module("fake_good", GOOD)
    _module("fake_clash", GOOD)
    fake_modules += ["fake_good", "fake_clash"]
    plugins = Plugins([_ep("first", "fake_good"), _ep("second", "fake_clash")])
    [failure] = plugins.failures
    assert "'first'" in failure.error and "'second'" in failure.error
    assert plugins.backends.owner("good") == "first"


def test_duplicate_of_a_builtin_is_rejected(fake_modules: list[str]) -> None:
    _module(
        "fake_ref",
        """
        from sdkit.plugins import hookimpl
        from sdkit.reference import ReferenceBackend
        @hookimpl
        def sdkit_register_backends(registry):
            registry.add(ReferenceBackend)
        """,
    )
    fake_modules += ["fake_ref"]
    plugins = Plugins([_ep("impostor", "fake_ref")])
    assert plugins.backends.owner("reference") == "core"
    assert "'core'" in plugins.failures[0].error and "'impostor'" in plugins.failures[0].error


def test_raising_hook_drops_only_that_plugin(fake_modules: list[str]) -> None:
    _module("fake_good", GOOD)
    _module(
        "fake_raises",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_backends(registry):
            raise RuntimeError("boom")
        """,
    )
    fake_modules += ["fake_good", "fake_raises"]
    plugins = Plugins([_ep("good", "fake_good"), _ep("raises", "fake_raises")])
    assert "good" in plugins.backends.names()
    assert [(f.name, f.stage) for f in plugins.failures] == [("raises", "register")]
    assert "boom" in plugins.failures[0].error


def test_registration_by_module_attr_reference(fake_modules: list[str]) -> None:
    """A hook module may name its classes as "module:attr" (how core's built-in plugin registers
    what lives above the plugins layer); a bad reference drops that plugin, not the others."""
    _module("fake_good", GOOD)
    _module(
        "fake_by_name",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_backends(registry):
            registry.add("fake_good:GoodBackend")
        """,
    )
    _module(
        "fake_bad_reference",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_backends(registry):
            registry.add("fake_good:NoSuchBackend")
        """,
    )
    fake_modules += ["fake_good", "fake_by_name", "fake_bad_reference"]
    plugins = Plugins([_ep("byname", "fake_by_name"), _ep("bad", "fake_bad_reference")])
    assert plugins.backends.owner("good") == "byname"
    assert [(f.name, f.stage) for f in plugins.failures] == [("bad", "register")]
    assert "NoSuchBackend" in plugins.failures[0].error
    with pytest.raises(ValueError, match="module:attr"):
        plugins.backends.add("fake_good.GoodBackend")


def test_core_registers_its_own_implementations_by_reference() -> None:
    plugins = Plugins([])
    assert plugins.backends.owner("reference") == "core"
    assert plugins.loaders.names() == ["onnx", "diffusers-onnx", "checkpoint"]
    assert plugins.families.names() == [
        "sd1", "sd1_inpaint", "sd2", "sd2v", "sdxl", "sdxl_inpaint", "sdxl_refiner", "flux_dev", "flux_schnell",
        "sd3_medium", "sd35_large", "sd35_medium", "chroma", "tiny_digits",
    ]  # fmt: skip
    assert all(plugins.families.owner(name) == "core" for name in plugins.families.names())
    assert plugins.schedulers.names()[:9] == [
        "euler",
        "euler_a",
        "heun",
        "dpmpp_2m",
        "dpmpp_2m_sde",
        "dpmpp_sde",
        "ddim",
        "lcm",
        "euler_flow",
    ]
    # issue 27's samplers (UniPC, DEIS, iPNDM, TCD and their flow variants) follow
    assert {"uni_pc", "uni_pc_bh2", "deis", "ipndm", "ipndm_v", "tcd", "uni_pc_flow", "deis_flow"} <= set(
        plugins.schedulers.names()
    )
    assert all(plugins.schedulers.owner(name) == "core" for name in plugins.schedulers.names())


def test_reset_plugins_forgets_backend_instances_and_probes() -> None:
    from sdkit.plugins import get_plugins, reset_plugins
    from sdkit.selection import get_backend, probe

    backend = get_backend("reference")
    probe(backend)
    assert get_plugins().probes["reference"].ok
    assert get_backend("reference") is backend
    reset_plugins()
    assert get_plugins().probes == {}
    assert get_backend("reference") is not backend


def test_unknown_hook_is_a_validation_failure(fake_modules: list[str]) -> None:
    _module(
        "fake_unknown",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_nothing(registry):
            pass
        """,
    )
    fake_modules += ["fake_unknown"]
    plugins = Plugins([_ep("unknown", "fake_unknown")])
    [failure] = plugins.failures
    assert failure.stage == "validate" and "sdkit_register_nothing" in failure.error


def test_addhooks_lets_a_plugin_publish_its_own_hook(fake_modules: list[str]) -> None:
    """A plugin's own hook spec (published through historic sdkit_addhooks) validates a third
    plugin's implementation of it, whatever the loading order."""
    _module(
        "fake_spec",
        """
        import pluggy
        from sdkit.plugins import hookimpl
        spec = pluggy.HookspecMarker("sdkit")
        class Specs:
            @spec
            def sdkit_fake_register_things(self, things):
                "Add things."
        @hookimpl
        def sdkit_addhooks(pluginmanager):
            pluginmanager.add_hookspecs(Specs)
        """,
    )
    _module(
        "fake_user",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_fake_register_things(things):
            things.append("mine")
        """,
    )
    fake_modules += ["fake_spec", "fake_user"]
    plugins = Plugins([_ep("a_user", "fake_user"), _ep("b_spec", "fake_spec")])
    assert plugins.failures == []
    things: list[str] = []
    plugins.pm.hook.sdkit_fake_register_things(things=things)
    assert things == ["mine"]


def test_every_hook_spec_is_documented_and_exercised() -> None:
    specs = {n: f for n, f in inspect.getmembers(specs_module, inspect.isfunction) if n.startswith("sdkit_")}
    assert set(specs) == {
        "sdkit_register_backends",
        "sdkit_register_model_loaders",
        "sdkit_register_schedulers",
        "sdkit_register_model_families",
        "sdkit_addhooks",
    }
    for name, function in specs.items():
        assert function.__doc__ and len(function.__doc__.strip()) > 40, f"{name} needs a docstring"
    tests = Path(__file__).read_text()
    for name in specs:
        assert name in tests, f"no test mentions {name}"
    # sdkit_register_model_loaders, sdkit_register_schedulers and sdkit_register_model_families:
    # through core's own plugin (and test_model_families_register_like_any_plugin below)
    plugins = Plugins([])
    assert "onnx" in plugins.loaders.names()
    assert isinstance(plugins.schedulers.names(), list)
    assert plugins.backends.get("reference") is ReferenceBackend
    assert [f.name for f in plugins.families.families()][:1] == ["sd2v"]  # highest priority first


FAMILY_PLUGIN = """
from sdkit.plugins import hookimpl
from sdkit.families import builtin, sd_family

MINE = sd_family(
    "my_sd1", "my SD 1.x", unet_graph="sd1_unet", unet_config={**builtin.SD1_UNET, "cross_attention_dim": 512},
    text_encoders=(builtin.CLIP_L,), vae_config=builtin.SD_VAE, scheduler_config=builtin.SD15_SCHEDULER,
    tokenizers={"text_encoder": builtin.CLIP_VOCAB}, text_outputs=builtin.SD_OUTPUTS,
)

@hookimpl
def sdkit_register_model_families(registry):
    registry.add(MINE)
"""


def test_model_families_register_like_any_plugin(fake_modules: list[str]) -> None:
    """A plugin adds a family object (or a reference to one); a duplicate name or an object that
    is not a Family drops that plugin only."""
    _module("fake_family", FAMILY_PLUGIN)
    _module(
        "fake_family_dup",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_model_families(registry):
            registry.add("sdkit.families.builtin:SD1")
        """,
    )
    _module(
        "fake_family_bad",
        """
        from sdkit.plugins import hookimpl
        @hookimpl
        def sdkit_register_model_families(registry):
            registry.add(object())
        """,
    )
    fake_modules += ["fake_family", "fake_family_dup", "fake_family_bad"]
    plugins = Plugins([_ep("mine", "fake_family"), _ep("dup", "fake_family_dup"), _ep("bad", "fake_family_bad")])
    assert plugins.families.owner("my_sd1") == "mine"
    mine = plugins.families.family("my_sd1")
    assert mine is not None and mine.label == "my SD 1.x"
    assert sorted((f.name, f.stage) for f in plugins.failures) == [("bad", "register"), ("dup", "register")]
    assert "sd1" in next(f.error for f in plugins.failures if f.name == "dup")
    assert "not a sdkit.families.Family" in next(f.error for f in plugins.failures if f.name == "bad")


VENDOR_MODULES = (
    "tensorrt", "tensorrt_rtx", "openvino", "coremltools", "migraphx", "cuda", "torch", "stable_diffusion_cpp",
)  # fmt: skip


def test_loading_all_plugins_imports_no_vendor_sdk() -> None:
    code = textwrap.dedent(
        f"""
        import sys, json
        from sdkit.plugins import get_plugins
        plugins = get_plugins()
        vendor = [m for m in {VENDOR_MODULES!r} if m in sys.modules]
        vendor += [m for m in sys.modules if "ggml" in m and not m.startswith("sdkit_ggml")]
        print(json.dumps({{"loaded": [i.name for i in plugins.loaded], "vendor": vendor}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=dict(os.environ))
    result = json.loads(out.stdout)
    assert result["vendor"] == [], f"plugin hook modules imported vendor SDKs: {result['vendor']}"


def test_broken_installed_distribution_is_reported_by_the_cli(tmp_path: Path) -> None:
    """A real (broken) distribution on sys.path: `sdkit backends --json` reports it and the
    other plugins still load."""
    dist = tmp_path / "sdkit_broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sdkit-broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[sdkit]\nbroken = sdkit_broken_plugin.hooks\n")
    package = tmp_path / "sdkit_broken_plugin"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "hooks.py").write_text("raise ImportError('this plugin is broken on purpose')\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-m", "sdkit.cli.main", "backends", "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    data = json.loads(out.stdout)
    [failure] = [f for f in data["plugin_failures"] if f["name"] == "broken"]
    assert failure["distribution"] == "sdkit-broken-plugin"
    assert "broken on purpose" in failure["error"]
    assert "reference" in [b["name"] for b in data["backends"]]


def test_plugin_calling_back_into_sdkit_while_loading_fails_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch, fake_modules: list[str]
) -> None:
    from sdkit.plugins import get_plugins, reset_plugins

    _module(
        "fake_reentrant",
        """
        from sdkit.plugins import hookimpl, get_plugins
        @hookimpl
        def sdkit_register_schedulers(registry):
            get_plugins()  # e.g. to look up a built-in scheduler to subclass
        """,
    )
    fake_modules += ["fake_reentrant"]
    ep = _ep("reentrant", "fake_reentrant")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [ep])
    reset_plugins()
    plugins = get_plugins()
    [failure] = plugins.failures
    assert failure.name == "reentrant"
    assert "still loading" in failure.error
    assert "euler" in plugins.schedulers.names()
