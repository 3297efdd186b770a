"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

Everything the server refuses goes through `APIError`, so a client never sees a traceback.
`from_engine` maps the engine's own errors (raised in the worker thread) onto statuses.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, Optional

from starlette.responses import JSONResponse

from ..errors import ContextLengthError, InvalidArgumentError, NumericalError

# OpenAI's error `type`: "invalid_request_error" for a 4xx status, "server_error" for a 5xx, but these.
TYPES = {429: "rate_limit_error"}


class APIError(Exception):
    """An answer other than 200: status, message (what was wrong and what is allowed), param, code."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None, code: Optional[str] = None,
                 headers: Optional[Dict[str, str]] = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @property
    def type(self) -> str:
        return TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def named(self, param: str, also: Optional[Dict[str, str]] = None) -> APIError:
        """This error in another API's terms: about `param`, its name for the field (a message that
        starts with the field's name here starts with it), and `also` other names in the message."""
        message = self.message
        if self.param and message.startswith(self.param):
            message = param + message[len(self.param):]
        for old, new in (also or {}).items():
            message = message.replace(old, new)
        return APIError(self.status, message, param=param, code=self.code, headers=self.headers)


def invalid(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    """A 400: the request is well-formed HTTP but a field is wrong."""
    return APIError(400, message, param=param, code=code)


def unsupported(message: str, param: str) -> APIError:
    """A 400 for an OpenAI feature this server does not implement (n > 1, logprobs, forced tool calls...)."""
    return APIError(400, message, param=param, code="unsupported_parameter")


def checked(rule: Callable, value, param: str):
    """Run one of the engine's argument checks; its InvalidArgumentError becomes a 400 naming `param`."""
    try:
        return rule(value)
    except InvalidArgumentError as e:
        message = str(e)
        if not message.startswith(param):
            message = f"{param}: {message}"
        raise invalid(message, param) from None


def shutting_down() -> APIError:
    return APIError(503, "the server is shutting down; retry against another instance or once it restarts",
                    code="shutting_down", headers={"Retry-After": "5"})


# Request fields the engine checks (its messages start with the field's name): a 400 names them.
ENGINE_CHECKED = ("drafter", "tools", "tool_choice", "response_format", "chat_template_kwargs", "logit_bias",
                  "stop_token_ids", "ignore_eos", "min_tokens", "suffix", "continue_final_message")


def from_engine(exc: BaseException, prompt_param: str) -> APIError:
    """The engine's exception -> the status a client should get (engine errors are never 4xx by accident)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ContextLengthError):
        return APIError(400, f"{exc} (the server's window: mlxspec serve --max-kv-size W)", param=prompt_param,
                        code="context_length_exceeded")
    if isinstance(exc, InvalidArgumentError):  # what only the engine can check: the prompt, the drafter
        message = str(exc)
        field = re.split(r"[ :\[]", message, maxsplit=1)[0]  # (tools[0].function.parameters: tools)
        param = prompt_param if field == "prompt" else field if field in ENGINE_CHECKED else None
        return invalid(message, param)
    if isinstance(exc, NumericalError):
        return APIError(500, str(exc), code="numerical_error")
    return APIError(500, f"the engine failed ({type(exc).__name__}: {exc}); the server keeps serving",
                    code="engine_error")


def internal(exc: Exception) -> APIError:
    return APIError(500, f"internal server error ({type(exc).__name__}); the details are in the server's log",
                    code="internal_error")
