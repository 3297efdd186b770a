"""POST /tokenize and /detokenize: the model's own token ids of a prompt or chat, and back
(vLLM's shapes, and llama.cpp's for its `content`), so a client can count tokens against
the context or build token-id prompts without a copy of the tokenizer; and llama.cpp's POST
/apply-template: a chat as the text the model reads, to send to /completion as a prompt.

Run off the event loop (`asyncio.to_thread`): a long chat renders and encodes for a while.
"""

from __future__ import annotations

from typing import Optional

from ..errors import InvalidArgumentError, shown
from ..logprobs import token_bytes
from ..prompts import check_in_vocab, check_template_kwargs, check_text, encode_prompt, render_chat
from ..tools import check_tools
from .errors import checked, invalid
from .schema import flag


def tokenize(engine, body: dict, messages) -> dict:
    """{"prompt": text} or {"messages": [...]} (with `tools`, `chat_template_kwargs`) -> {"tokens",
    "count", "max_model_len"} (and "token_strs" with `return_token_strs`), vLLM's; llama.cpp's
    {"content": text} without special tokens unless `add_special`, its `parse_special` and
    `with_pieces` (tokens as {"id", "piece"}). `messages` is the server's check of chat messages."""
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise invalid("this server's model has no tokenizer", None)
    text = body.get("prompt", body.get("content"))
    llama = body.get("prompt") is None and text is not None  # llama.cpp's `content`: its defaults
    field = "content" if llama else "prompt"
    if (text is None) == (body.get("messages") is None):
        raise invalid("send one of prompt (a string) or messages (a chat), as for /v1/completions and "
                      "/v1/chat/completions", "prompt")
    try:
        if text is not None:
            if not isinstance(text, str):
                raise invalid(f"{field} must be a string, got {shown(text)}", field)
            check_text(text, field)
            special = flag(body, "add_special", False) if llama else flag(body, "add_special_tokens", True)
            if not text:
                ids = []
            elif not flag(body, "parse_special", True):  # llama.cpp's: "<|im_start|>" is read as its characters
                ids = tokenizer.encode(text, add_special_tokens=special, split_special_tokens=True)
            else:
                ids = encode_prompt(text, tokenizer, engine.vocab_size) if special else \
                    tokenizer.encode(text, add_special_tokens=False)
        else:
            chat, tools, kwargs, keep_going = _chat(body, messages)
            ids = encode_prompt(chat, tokenizer, engine.vocab_size, tools=tools, template_kwargs=kwargs,
                                continue_final=keep_going)
    except InvalidArgumentError as e:
        raise invalid(str(e), "messages" if text is None else field) from None
    out = {"count": len(ids), "max_model_len": getattr(engine, "context", None), "tokens": ids, "token_strs": None}
    if flag(body, "return_token_strs", False):
        out["token_strs"] = tokenizer.convert_ids_to_tokens(ids)
    if flag(body, "with_pieces", False):  # llama.cpp's: each token's text, or its bytes where they are no text
        out["tokens"] = [{"id": t, "piece": _piece(token_bytes(tokenizer, t))} for t in ids]
    return out


def _piece(data: bytes):
    try:
        return data.decode()
    except UnicodeDecodeError:
        return list(data)


def apply_template(engine, body: dict, messages) -> dict:
    """{"messages": [...]} (with `tools`, `chat_template_kwargs`) -> {"prompt": the text the model
    reads}, which /completion answers as the chat routes answer the messages."""
    if engine.tokenizer is None:
        raise invalid("this server's model has no tokenizer", None)
    if body.get("messages") is None:
        raise invalid("messages is required: the chat to render, as for /v1/chat/completions", "messages")
    try:
        chat, tools, kwargs, keep_going = _chat(body, messages)
        return {"prompt": render_chat(chat, engine.tokenizer, tools, kwargs, keep_going)}
    except InvalidArgumentError as e:
        raise invalid(str(e), "messages") from None


def _chat(body: dict, messages) -> tuple:
    """The chat `body` sends, checked: (its messages, tools, template variables, continue_final_message)."""
    keep_going = flag(body, "continue_final_message", False)
    if body.get("add_generation_prompt") is False and not keep_going:
        raise invalid("add_generation_prompt false alone is not supported: a chat is rendered as the model reads it, "
                      "its generation prompt included (or, with continue_final_message true, ending inside its last "
                      "message)", "add_generation_prompt")
    tools = checked(check_tools, body.get("tools"), "tools")  # (None for none or [])
    kwargs = checked(check_template_kwargs, body.get("chat_template_kwargs"), "chat_template_kwargs")
    return messages(body["messages"]), tools, kwargs, keep_going


def detokenize(engine, body: dict) -> dict:
    """{"tokens": [ids]} -> {"prompt": their text} (and llama.cpp's "content", the same)."""
    tokens = body.get("tokens")
    vocab = engine.vocab_size
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise invalid(f"tokens must be a list of token ids, got {shown(tokens)}", "tokens")
    checked(lambda ids: check_in_vocab(ids, vocab, "tokens:"), tokens, "tokens")
    text = engine.tokenizer.decode(tokens) if tokens else ""
    return {"prompt": text, "content": text}


def model_param(body: dict) -> Optional[str]:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(f"model must be a string, got {shown(model)}", "model")
    return model
