"""Request bodies: a JSON object within the size limit, read without stalling forever; fields
sent where another endpoint reads them refused, fields nothing reads named once in the log.
"""

from __future__ import annotations

import asyncio
import json
import logging

from starlette.requests import Request

from ..errors import shown as _show
from . import fields
from .errors import APIError, invalid, unsupported

log = logging.getLogger("mlxspec.serve")


async def read_json(request: Request, limit: int, timeout: float = 0) -> dict:
    """The body as a JSON object; 413 past `limit` bytes (declared or streamed), 400 if not JSON,
    408 when more than `timeout` seconds pass without any of it (0: no limit)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, f"declares {int(declared)} bytes")
    body = bytearray()
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), timeout or None)
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body stalled: nothing of it came for {timeout:g} s "
                                f"(mlxspec serve --client-timeout)", code="request_timeout") from None
        body += chunk
        if len(body) > limit:
            raise _too_large(limit, f"is longer than {limit} bytes")
    if not body.strip():
        raise invalid("the request body is empty: send a JSON object", code="invalid_json")
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except RecursionError:
        raise invalid("the request body nests JSON too deeply", code="invalid_json") from None
    if not isinstance(data, dict):
        kinds = {list: "array", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}
        raise invalid(f"the request body must be a JSON object, got a JSON {kinds[type(data)]}", code="invalid_json")
    if (wrong := fields.moved(request.url.path, data)) is not None:
        key, instead = wrong
        raise unsupported(f"{key} is not read at {request.url.path}: send {instead} instead (got {_show(data[key])})",
                          key)
    ignored = fields.unread(request.url.path, data)
    # told to the log, not the client: vendor extras are normal, a typo is not
    if ignored and request.app.state.mlxspec.first_told(request.url.path, ignored):
        more = f" and {len(ignored) - fields.SHOWN} more" if len(ignored) > fields.SHOWN else ""
        log.warning("%s %s: ignored fields this endpoint does not read: %s%s (said once per route and set of "
                    "fields)", request.method, request.url.path,
                    ", ".join(_show(key) for key in ignored[:fields.SHOWN]), more)
    return data


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _too_large(limit: int, what: str) -> APIError:
    return APIError(413, f"the request body {what}; this server accepts at most {limit} bytes "
                    "(mlxspec serve --max-body-size)", code="request_too_large")
