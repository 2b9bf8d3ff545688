"""Who may call the API and how much they may send: the API key check, the body size limit, and
the guard against web pages driving a server on the user's machine (``RequestGuard``)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBasic, HTTPBasicCredentials, HTTPBearer

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

# Declared so the OpenAPI schema documents both ways to send the key; checked by hand below.
bearer_scheme = HTTPBearer(auto_error=False, description="Authorization: Bearer <api key>")
basic_scheme = HTTPBasic(auto_error=False, description="A1111 clients' --api-auth: any user name, the key as password")


def presented_key(request: Request) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, or HTTP Basic with the key as
    password (A1111 clients configured with ``--api-auth user:KEY``)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        return decoded.partition(":")[2]
    return None


def key_matches(presented: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing says nothing about how much of a guess was right."""
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))


def require_api_key(expected: str | None, challenge: str = "Bearer") -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency refusing requests without the key (a no-op when no key is set);
    ``challenge``: the 401's ``WWW-Authenticate`` (``Basic ...`` makes a browser ask for it)."""

    async def open_to_all() -> None:
        return None

    async def check(
        request: Request,
        _bearer: HTTPAuthorizationCredentials | None = Depends(bearer_scheme),  # noqa: B008 (FastAPI's idiom)
        _basic: HTTPBasicCredentials | None = Depends(basic_scheme),  # noqa: B008
    ) -> None:
        if expected is not None and not key_matches(presented_key(request), expected):
            raise HTTPException(
                status_code=401,
                detail="missing or wrong API key (send Authorization: Bearer KEY)",
                headers={"WWW-Authenticate": challenge},
            )

    return open_to_all if expected is None else check


_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_JSON_DEPTH = 32  # A1111's own payloads nest 5 or 6 levels (alwayson_scripts)


def json_depth(value: Any, limit: int) -> int:
    """How deep ``value`` nests (a scalar: 0), counted iteratively and only up to ``limit + 1``."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth + 1)
            if deepest > limit:
                return deepest
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


async def limit_json_depth(request: Request) -> None:
    """A FastAPI dependency refusing (422) a JSON body nested deeper than ``MAX_JSON_DEPTH``
    before any work: extra fields are accepted and echoed back, and a deep one broke only the
    answer (a 500 after the image was made). FastAPI has parsed the body already (cached)."""
    if request.method not in _UNSAFE_METHODS or not request.headers.get("content-length", "1").strip("0"):
        return
    try:
        body = await request.json()
    except Exception:  # not JSON: FastAPI's own validation says so
        return
    if json_depth(body, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        message = f"the body nests deeper than {MAX_JSON_DEPTH} levels"
        raise RequestValidationError([{"loc": ("body",), "msg": message, "type": "too_deep"}])


class BodyTooLargeError(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over this server's limit of {limit} bytes (--max-body-mb)")


class BodySizeLimit:
    """ASGI middleware: refuse a body over ``max_bytes`` with 413, by its Content-Length before
    reading it, or while it streams in when it has none."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLargeError(self.max_bytes)  # FastAPI re-raises HTTPExceptions from body parsing
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, send: Send) -> None:
        await send_error(send, 413, "BodyTooLarge", BodyTooLargeError(self.max_bytes).detail)


# -- who may reach the API from a browser ---------------------------------------------------------

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def host_name(value: str) -> str:
    """``"example.com:7860"`` -> ``"example.com"``, ``"[::1]:7860"`` -> ``"::1"`` (lower case)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_ip(name: str, loopback_only: bool) -> bool:
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_loopback or not loopback_only


class RequestGuard:
    """ASGI middleware against the two ways a web page the user visits can drive a server on
    their machine. DNS rebinding: without an API key, a ``Host`` that is not the bound address,
    ``localhost`` or a loopback address is refused (403), so a page on ``evil.example`` whose name
    now resolves to 127.0.0.1 cannot read the answers (an IP literal is accepted when bound to
    every address, 0.0.0.0 or ::). Cross-site requests: a state-changing request (POST...) from
    another origin (its ``Origin`` or ``Sec-Fetch-Site``) is refused (403), key or no key, and so
    is a body a form can send (form or text content types: 415): browsers send those without
    asking the server first, JSON they do not."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], host: str, api_key: str | None) -> None:
        self.app = app
        self.check_host = api_key is None
        bound = host_name(host)
        self.hosts = _LOOPBACK_NAMES | {bound}
        self.any_ip = bound in ("0.0.0.0", "::", "")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
            refused = self.refusal(str(scope.get("method", "GET")).upper(), headers)
            if refused is not None:
                await send_error(send, *refused)
                return
        await self.app(scope, receive, send)

    def refusal(self, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """(status, error, detail) for a request to refuse, else None."""
        host = headers.get("host", "")
        if self.check_host and not self.host_allowed(host_name(host)):
            detail = (
                f"the Host header {host!r} is not this server's address: refused, as a web page could "
                "point its own name at this machine (DNS rebinding); use localhost or the address it "
                "listens on, or give the server --api-key"
            )
            return 403, "HostRefused", detail
        if method not in _UNSAFE_METHODS:
            return None
        origin, site = headers.get("origin"), headers.get("sec-fetch-site", "").lower()
        foreign = origin is not None and _origin_netloc(origin) != host.strip().lower()
        if foreign or site in ("cross-site", "same-site"):
            return 403, "CrossSiteRefused", f"a {method} from another site ({origin or site}) is refused"
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media and media != "application/json" and not media.endswith("+json"):
            return 415, "UnsupportedMediaType", f"a {method} body must be JSON (application/json), not {media}"
        return None

    def host_allowed(self, name: str) -> bool:
        return name in self.hosts or _is_ip(name, loopback_only=not self.any_ip)


def _origin_netloc(origin: str) -> str:
    """``"http://127.0.0.1:7860"`` -> ``"127.0.0.1:7860"``; ``"null"`` and the like -> ``""``."""
    scheme, sep, rest = origin.strip().lower().partition("://")
    return rest.rstrip("/") if sep and scheme in ("http", "https") else ""


async def send_error(send: Send, status: int, error: str, detail: str) -> None:
    """A JSON ``{"error", "detail"}`` answer sent straight from ASGI middleware."""
    body = json.dumps({"error": error, "detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
