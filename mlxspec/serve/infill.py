"""llama.cpp's POST /infill, for the editor extensions that complete code at the cursor with it
(llama.vscode, llama.vim, llama.qtcreator, minuet-ai.el).

The text before the cursor (`input_prefix`, then `prompt`: what the line holds so far), the text
after it (`input_suffix`) and other files' text (`input_extra`: `{"filename", "text"}`) are laid
out as llama.cpp lays them out, with the model's own fill-in-the-middle and repository markers
(`FimFormat.encode`, `FimFormat.context`); other files' text is cut from its start to leave the
answer room in the context. The ids are answered as llama.cpp's /completion answers a prompt
(`llama_cpp.answer`: the same fields, limits and shape), ending at the model's end-of-middle
tokens.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, List, Tuple

from starlette.requests import Request
from starlette.responses import Response

from ..errors import shown
from .body import read_json
from .errors import invalid
from .generation import guarded
from .llama_cpp import answer, n_predict

if TYPE_CHECKING:
    from .app import ServerState


@guarded
async def infill(request: Request) -> Response:
    """POST /infill."""
    state: ServerState = request.app.state.mlxspec
    body = await read_json(request, state.options.max_body_size, state.options.client_timeout)
    limit = n_predict(body.get("n_predict"), state)
    ids, cut = await asyncio.to_thread(layout, state.engine, body, max(limit, 1))  # (tokenizing: off the loop)
    return await answer(request, body, ids, limit, endpoint="infill", param="input_prefix", truncated=cut,
                        stop_token_ids=list(state.engine.fim_format.ends))


def layout(engine, body: dict, max_tokens: int) -> Tuple[List[int], bool]:
    """The prompt's ids, and whether other files' text was cut to fit the context."""
    fmt = engine.fim_format
    if fmt is None:
        raise invalid("this model's vocabulary has no fill-in-the-middle markers, so it was not trained to fill in "
                      "between a prefix and a suffix; serve a code model that was (Qwen2.5-Coder, StarCoder2, "
                      "DeepSeek-Coder, Codestral)", "input_prefix")
    before, after, typed = (_text(body, key) for key in ("input_prefix", "input_suffix", "prompt"))
    fim = fmt.encode(engine.tokenizer, before + typed, after)
    extra = fmt.context(engine.tokenizer, _files(body.get("input_extra")))
    room = len(extra) if engine.context is None else max(0, engine.context - len(fim) - max_tokens)
    keep = min(len(extra), room)  # (their end: the files read last, as llama.cpp keeps)
    return extra[len(extra) - keep:] + fim, keep < len(extra)


def _text(body: dict, key: str) -> str:
    value = body.get(key, "")
    if not isinstance(value, str):
        raise invalid(f"{key} must be a string, got {shown(value)}", key)
    return value


def _files(chunks) -> List[Tuple[str, str]]:
    if chunks is None:
        return []
    if not isinstance(chunks, list):
        raise invalid(f"input_extra must be a list of {{\"filename\", \"text\"}} objects, got {shown(chunks)}",
                      "input_extra")
    files = []
    for i, chunk in enumerate(chunks):
        where = f"input_extra[{i}]"
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text", ""), str) \
                or not isinstance(chunk.get("filename", "tmp"), str):
            raise invalid(f"{where} must be {{\"filename\": a string, \"text\": a string}}, got {shown(chunk)}", where)
        files.append((chunk.get("filename", "tmp"), chunk.get("text", "")))
    return files


