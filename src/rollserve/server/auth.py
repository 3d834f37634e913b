"""Optional API key for every route: `Authorization: Api-Key <key>` (openpi style) or `Bearer <key>`.

Keys are compared in constant time; /healthz and /health stay open so load balancers can probe.
"""

from __future__ import annotations

import hmac

OPEN_PATHS = frozenset({"/healthz", "/health"})


def extract_key(authorization: str | None, x_api_key: str | None = None) -> str | None:
    """The key a client presented, from either accepted header."""
    if x_api_key:
        return x_api_key
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() in ("api-key", "bearer") and value:
        return value.strip()
    return None


def key_matches(expected: str | None, presented: str | None) -> bool:
    """True when no key is configured, or the presented key equals it (constant time)."""
    if expected is None:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(expected.encode(), presented.encode())


class ApiKeyMiddleware:
    """Pure ASGI middleware: rejects HTTP (401) and websocket (close 1008 before accept) without the key."""

    def __init__(self, app, api_key: str | None) -> None:  # type: ignore[no-untyped-def]
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if self.api_key is None or scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        presented = extract_key(headers.get("authorization"), headers.get("x-api-key"))
        if key_matches(self.api_key, presented):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or invalid API key"})
            return
        body = b'{"error":{"code":"unauthorized","message":"missing or invalid API key"}}'
        await send(
            {
                "type": "http.response.start",
                "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Api-Key")],
            }
        )
        await send({"type": "http.response.body", "body": body})
