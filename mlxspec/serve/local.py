"""A server bound to this machine only answers requests addressed to this machine.

Without it any web page the user opens could use the model: a page may POST to
http://127.0.0.1:8080 (a "simple" cross-origin request needs no preflight), and a DNS-rebinding
page, whose own host name resolves to 127.0.0.1, can also read the answers. Browsers say where
a request comes from (`Origin`) and whom it is for (`Host`); other clients, which send no
`Origin`, are unaffected.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from starlette.datastructures import Headers

from .auth import refuse
from .errors import APIError


def is_loopback(host: str) -> bool:
    """`host` names this machine only: localhost (and its subdomains, RFC 6761) or a loopback address."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hostname(url: str) -> str:
    """The host name in a URL or an origin ("" when there is none, or it is no URL: "http://[bad")."""
    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


class LoopbackOnly:
    """ASGI middleware: 403 for requests whose Host is not this machine, or whose Origin (when a
    browser sends one) is not in `origins` (this machine's pages, and those `--allow-origin` names)."""

    def __init__(self, app, origins=None):
        from .cors import Origins

        self.app, self.origins = app, origins if origins is not None else Origins()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            host, origin = headers.get("host"), headers.get("origin")
            why = None
            if host is not None and not is_loopback(hostname(f"//{host}")):  # browsers always send one
                why = f"it is addressed to host {host[:80]!r}"
            elif origin is not None and origin not in self.origins:
                why = f"it comes from a web page of {origin[:80]!r}"  # "null": a sandboxed or file: page
            if why:
                error = APIError(403, f"this server is bound to this machine and refuses the request: {why}. Serve "
                                      f"others with --host 0.0.0.0 and --api-key, or through a proxy on this "
                                      f"machine that sends 'Host: localhost'; let a web page's origin in with "
                                      f"--allow-origin", code="forbidden_host")
                await refuse(error, scope, receive, send)
                return
        await self.app(scope, receive, send)
