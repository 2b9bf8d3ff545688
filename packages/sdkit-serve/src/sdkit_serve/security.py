"""Who may call the API and how much they may send: the API key check and the body size limit."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Depends, HTTPException, Request
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


def require_api_key(expected: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency refusing requests without the key (a no-op when no key is set)."""

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
                headers={"WWW-Authenticate": "Bearer"},
            )

    return open_to_all if expected is None else check


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
        body = json.dumps({"error": "BodyTooLarge", "detail": BodyTooLargeError(self.max_bytes).detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})
