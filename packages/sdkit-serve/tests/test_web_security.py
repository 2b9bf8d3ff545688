"""What a web page the user visits can do to a server on their machine, and the key's reach
(issue 30, items 2 and 6): DNS rebinding (a foreign Host), cross-site posts (form content types,
a foreign Origin), absolute paths in answers, the docs behind the key, keys that cannot work,
deeply nested extra fields and damaged images. Real servers (conftest's), plus the guard's rules
on their own."""

from __future__ import annotations

import base64
import struct
from pathlib import Path
from typing import Any

import httpx
import pytest
from serve_helpers import API_KEY, ServerProcess

from sdkit.errors import InputError, OptionError
from sdkit_serve.config import Limits, ServerConfig
from sdkit_serve.images import decode_image
from sdkit_serve.security import RequestGuard, host_name, json_depth


def _get(server: ServerProcess, path: str, **headers: str) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", headers={**server.headers, **headers}, timeout=60)


def _post(server: ServerProcess, path: str, content: bytes = b"", **headers: str) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=content, headers={**server.headers, **headers}, timeout=60)


def test_a_keyless_server_answers_only_its_own_host_names(small_server: ServerProcess) -> None:
    port = small_server.port
    rebound = _get(small_server, "/sdapi/v1/options", host=f"evil.example:{port}")
    assert rebound.status_code == 403 and rebound.json()["error"] == "HostRefused", rebound.text
    assert "DNS rebinding" in rebound.json()["detail"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "LOCALHOST"):
        assert _get(small_server, "/sdapi/v1/options", host=host).status_code == 200, host


def test_a_server_with_a_key_answers_any_host(server: ServerProcess) -> None:
    assert _get(server, "/sdapi/v1/options", host="sdkit.example.org").status_code == 200


def test_cross_site_posts_are_refused(small_server: ServerProcess) -> None:
    origin = f"http://127.0.0.1:{small_server.port}"
    form = _post(small_server, "/sdapi/v1/interrupt", b"", **{"content-type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415 and form.json()["error"] == "UnsupportedMediaType", form.text
    text = _post(small_server, "/sdapi/v1/txt2img", b'{"steps": 2}', **{"content-type": "text/plain"})
    assert text.status_code == 415
    foreign = _post(small_server, "/sdapi/v1/interrupt", origin="https://evil.example")
    assert foreign.status_code == 403 and foreign.json()["error"] == "CrossSiteRefused"
    assert _post(small_server, "/sdapi/v1/interrupt", origin="null").status_code == 403
    assert _post(small_server, "/sdapi/v1/interrupt", **{"sec-fetch-site": "cross-site"}).status_code == 403
    # what A1111 clients send: no body, or JSON; and the same origin (the docs page)
    assert _post(small_server, "/sdapi/v1/interrupt").json() == {"interrupted": False}
    assert _post(small_server, "/sdapi/v1/interrupt", origin=origin, **{"sec-fetch-site": "same-origin"}).is_success
    same = _post(small_server, "/sdapi/v1/options", b"{}", origin=origin, **{"content-type": "application/json"})
    assert same.status_code == 200, same.text


def test_answers_hold_no_absolute_paths(server: ServerProcess, tiny: Path) -> None:
    models = _get(server, "/sdapi/v1/sd-models")
    loras = _get(server, "/sdapi/v1/loras")
    assert [m["filename"] for m in models.json()] == ["model", "tiny_b"]
    assert [lora["path"] for lora in loras.json()] == ["film.safetensors"]
    for answer in (models, loras, _get(server, "/sdapi/v1/options")):
        assert str(tiny.parent) not in answer.text and "/tmp" not in answer.text, answer.text


def test_the_docs_need_the_key(server: ServerProcess, small_server: ServerProcess) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        refused = httpx.get(f"{server.url}{path}", timeout=60)
        assert refused.status_code == 401, (path, refused.status_code)
        assert refused.headers["www-authenticate"].startswith("Basic")  # a browser asks for it
        assert httpx.get(f"{server.url}{path}", auth=("me", API_KEY), timeout=60).status_code == 200
    schema = _get(server, "/openapi.json").json()
    assert "/sdapi/v1/txt2img" in schema["paths"] and "/docs" not in schema["paths"]
    assert _get(small_server, "/openapi.json").status_code == 200  # no key: open, as every route


def test_keys_that_cannot_work_are_refused_at_startup(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sdkit.cli.main import main

    for key, message in (("", "empty"), ("  ", "empty"), ("clé-secrète", "printable ASCII"), ("a b", "printable")):
        with pytest.raises(OptionError, match=message):
            ServerConfig(models=(tiny,), api_key=key)
    assert main(["serve", "--model", str(tiny), "--api-key", ""]) == 1  # refused, not an open server
    monkeypatch.setenv("SDKIT_API_KEY", "")  # an empty variable is an unset one
    from sdkit_serve.cli import api_key_from

    assert api_key_from(type("Args", (), {"api_key": None})()) is None


def test_deeply_nested_extra_fields_are_refused_before_generating(small_server: ServerProcess) -> None:
    nested: Any = "x"
    for _ in range(400):
        nested = {"a": nested}
    body = httpx.Request("POST", "/", json={"steps": 2, "alwayson_scripts": nested}).read()
    refused = _post(small_server, "/sdapi/v1/txt2img", body, **{"content-type": "application/json"})
    assert refused.status_code == 422 and "nests deeper than 32 levels" in refused.json()["detail"], refused.text
    assert json_depth({"a": [1, {"b": 2}]}, 32) == 3


def _dds_with_unknown_pixel_format() -> bytes:
    header = struct.pack("<7I", 124, 0x1007, 16, 16, 0, 0, 0) + b"\0" * 44
    pixel_format = struct.pack("<2I4s5I", 32, 0x4, b"XXXX", 0, 0, 0, 0, 0)
    return b"DDS " + header + pixel_format + struct.pack("<5I", 0x1000, 0, 0, 0, 0) + b"\0" * 256


# a 16x16 TIFF with one tag damaged by the fuzzer: Pillow raised TypeError, a 500 until now
_DAMAGED_TIFF = (
    "SUkqAAgAAAAKAAABBAABAAAAEAAAAAEBBAABAAAAEAAAAAIBAwADAAAAhgAAAAMBAwABAAAAAQAAAAYBAwABAAAAAgAAABEBDAABAAAAjAAAABUB"
    "AwABAAAAAwAAABYBBAABAAAAEAAAABcBBAABAAAAAAMAABwBAwABAAAAAQAAAAAAAAAIAAgACAAKyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4K"
    "yB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4KyB4K"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_dds_with_unknown_pixel_format(), r"not a readable image \(accepted: PNG, JPEG"),  # was NotImplementedError
        (base64.b64decode(_DAMAGED_TIFF), "not a readable image: TypeError"),
    ],
)
def test_damaged_images_are_input_errors(data: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        decode_image(base64.b64encode(data).decode(), "init_images[0]", Limits())


@pytest.mark.parametrize(
    ("bound", "host", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1:7860", True),
        ("127.0.0.1", "[::1]:7860", True),
        ("127.0.0.1", "127.0.0.2", True),  # loopback
        ("127.0.0.1", "192.168.1.5:7860", False),
        ("127.0.0.1", "evil.example:7860", False),
        ("127.0.0.1", "", False),
        ("0.0.0.0", "192.168.1.5:7860", True),  # every address: an IP literal names this machine
        ("0.0.0.0", "evil.example", False),
        ("myhost.lan", "myhost.lan:7860", True),
    ],
)
def test_the_host_rule(bound: str, host: str, allowed: bool) -> None:
    guard = RequestGuard(lambda *_: None, host=bound, api_key=None)  # type: ignore[arg-type, return-value]
    assert (guard.refusal("GET", {"host": host}) is None) is allowed
    assert RequestGuard(lambda *_: None, host=bound, api_key="k").refusal("GET", {"host": host}) is None  # type: ignore[arg-type, return-value]
    assert host_name("[::1]:7860") == "::1" and host_name("Example.COM:1") == "example.com"
