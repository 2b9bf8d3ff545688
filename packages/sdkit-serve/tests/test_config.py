"""Configuration checks, the loopback rule and the API key comparison."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from starlette.requests import Request

from sdkit.errors import InputError, OptionError
from sdkit_serve.config import Limits, ServerConfig, check_bind, is_loopback, model_name
from sdkit_serve.security import key_matches, presented_key


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.5", False),
        ("myhost.example", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_public_bind_needs_a_key_or_an_explicit_force() -> None:
    check_bind("127.0.0.1", None, False)
    with pytest.raises(OptionError, match="--api-key"):
        check_bind("0.0.0.0", None, False)
    check_bind("0.0.0.0", "secret", False)
    check_bind("0.0.0.0", None, True)


def request_with(authorization: str | None) -> Request:
    headers = [(b"authorization", authorization.encode())] if authorization is not None else []
    return Request({"type": "http", "headers": headers, "method": "GET", "path": "/"})


def test_presented_key_and_comparison() -> None:
    basic = base64.b64encode(b"user:s3cret").decode()
    assert presented_key(request_with("Bearer s3cret")) == "s3cret"
    assert presented_key(request_with(f"Basic {basic}")) == "s3cret"
    assert presented_key(request_with("Basic !!!")) is None
    assert presented_key(request_with(None)) is None
    assert key_matches("s3cret", "s3cret")
    assert not key_matches("s3cre", "s3cret") and not key_matches(None, "s3cret")
    assert not key_matches("\u00e9", "e")  # non-ASCII keys compare as UTF-8 bytes, no TypeError


def test_limits_and_config_validation(tmp_path: Path) -> None:
    with pytest.raises(OptionError):
        Limits(max_steps=0)
    with pytest.raises(InputError, match="limit on image size"):
        Limits(max_width=64, max_height=64).check_pixels(1024, 1024, "init_images[0]")
    with pytest.raises(OptionError, match="at least one"):
        ServerConfig(models=())
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "a").mkdir()
    with pytest.raises(OptionError, match="share the name 'a'"):
        ServerConfig(models=(tmp_path / "a", tmp_path / "b" / "a"))
    with pytest.raises(InputError, match="preview decoder not found"):
        ServerConfig(models=(tmp_path / "a",), preview_decoder=tmp_path / "missing.onnx")
    link = tmp_path / "alias"
    link.symlink_to(tmp_path / "a")
    assert model_name(link) == "alias"


def test_the_server_isolates_backends_unless_told_not_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15: `sdkit serve` compiles with isolate=True by default (a native crash in a
    backend's compile or first run is one failed request, not a dead server)."""
    from sdkit_serve.engine import served_options

    monkeypatch.delenv("SDKIT_ISOLATE", raising=False)
    assert served_options({"threads": 2}) == {"threads": 2, "isolate": True}
    assert served_options({"isolate": False}) == {"isolate": False}
    monkeypatch.setenv("SDKIT_ISOLATE", "0")
    assert served_options({}) == {}
