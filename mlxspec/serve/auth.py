"""The API key: ASGI middleware that answers 401 to a request without it."""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers

from . import anthropic
from .errors import APIError
from .fields import api_route
from .metrics import count_error

OPEN_PATHS = ("/health", "/")  # answered without the API key (load balancers, scripts and agents probe them)


class BearerAuth:
    """ASGI middleware: every path but OPEN_PATHS needs `Authorization: Bearer <key>` (or
    Anthropic's `x-api-key: <key>`)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            headers = Headers(scope=scope)
            scheme, _, token = headers.get("authorization", "").partition(" ")
            token = token.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "")
            if not hmac.compare_digest(token.encode(), self.key):
                error = APIError(401, "missing or wrong API key: send the header 'Authorization: Bearer <key>' "
                                 "(or 'x-api-key: <key>') with the key the server was started with (--api-key)",
                                 code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
                await refuse(error, scope, receive, send)
                return
        await self.app(scope, receive, send)


async def refuse(error: APIError, scope, receive, send) -> None:
    """A middleware's error answer: in Anthropic's shape on its routes, and counted in /metrics
    (Starlette puts the app in the scope before its middleware runs)."""
    count_error(scope.get("app"), error.status)
    anthropic_path = api_route(scope["path"]).startswith("/v1/messages")
    await (anthropic.error_response(error) if anthropic_path else error.response())(scope, receive, send)
