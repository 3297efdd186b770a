"""Cross-origin requests: which web pages may read the server's answers.

A chat page running in a browser (a local web UI on another port, or a hosted one the user
points at this server) sends a preflight `OPTIONS` before its JSON `POST`, and reads the answer
only if the server names its origin in `Access-Control-Allow-Origin`. Pages of this machine
(http://localhost:PORT, http://127.0.0.1:PORT) may; others only when `mlxspec serve
--allow-origin` names them ("*": any). A page of another address asking for this machine
may also send Private Network Access's `Access-Control-Request-Private-Network` (Chrome before
its Local Network Access permission), answered alike.
The API key, if any, is still needed on the request that follows the preflight.
"""

from __future__ import annotations

from typing import Iterable

from starlette.datastructures import Headers
from starlette.responses import Response

from .local import hostname, is_loopback

METHODS = "GET, POST, DELETE, OPTIONS"
MAX_AGE = "600"  # seconds a browser may reuse a preflight's answer


class Origins:
    """The origins whose pages may read answers: this machine's, and those given ("*": any)."""

    def __init__(self, allowed: Iterable[str] = ()):
        allowed = [a.rstrip("/") for a in allowed]
        self.any = "*" in allowed
        self.named = {a.lower() for a in allowed if a != "*"}

    def __contains__(self, origin: str) -> bool:
        if origin == "null":  # sandboxed frames and file: pages share it: never trusted by name
            return self.any
        return self.any or origin.lower() in self.named or is_loopback(hostname(origin))


class CrossOrigin:
    """ASGI middleware: answers preflights of allowed origins, and adds their CORS headers to answers."""

    def __init__(self, app, origins: Origins):
        self.app, self.origins = app, origins

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or origin not in self.origins:
            return await self.app(scope, receive, send)  # no CORS headers: a browser keeps the answer from the page
        allow = {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            allow.update({"Access-Control-Allow-Methods": METHODS, "Access-Control-Max-Age": MAX_AGE})
            if headers.get("access-control-request-headers"):
                allow["Access-Control-Allow-Headers"] = headers["access-control-request-headers"]
            if headers.get("access-control-request-private-network") == "true":
                allow["Access-Control-Allow-Private-Network"] = "true"
            return await Response(status_code=204, headers=allow)(scope, receive, send)

        allow["Access-Control-Expose-Headers"] = "Retry-After"  # a page may read when to retry a 429 or 503

        async def send_with_cors(message):
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", []))
                               + [(k.lower().encode(), v.encode()) for k, v in allow.items()])
            await send(message)

        await self.app(scope, receive, send_with_cors)
