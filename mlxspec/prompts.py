"""Prompt -> token ids, and the checks every request goes through before any work starts."""

from __future__ import annotations

import operator
from typing import List, Optional

from .errors import ContextLengthError, InvalidArgumentError, one_line, shown

MAX_DRAFT = 32  # largest draft length a request may ask for (caches keep this much rollback room)


def check_text(text: str, what: str = "prompt") -> str:
    """`text` itself, if it is text a tokenizer can encode; InvalidArgumentError naming the
    character otherwise (a lone surrogate such as JSON's "\\ud800" is not Unicode text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise InvalidArgumentError(f"{what} is not valid Unicode text: character {e.start} is {text[e.start]!r} "
                                   f"({e.reason}); send UTF-8 text, with surrogates only in pairs") from None
    return text


def text_of(content) -> Optional[str]:
    """A string, or a list of {"type": "text", "text": ...} parts (OpenAI's and Anthropic's)
    joined by newlines; None for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") == "text"
                                         and isinstance(part.get("text"), str) for part in content):
        return "\n".join(part["text"] for part in content)
    return None


def _message_text(content, i: int) -> str:
    """A message's content: a string, or OpenAI's list of text parts (joined by newlines, as the server does)."""
    text = text_of(content)
    if text is None:
        raise InvalidArgumentError(f"message {i}'s content must be a string or a list of "
                                   f"{{'type': 'text', 'text': str}} parts, got {shown(content)}")
    return text


def as_mlx_lm_tokenizer(tokenizer):
    """A Hugging Face tokenizer wrapped in mlx-lm's `TokenizerWrapper` (its EOS ids and streaming
    detokenizer), as `mlx_lm.generate` does; anything else as it is."""
    if tokenizer is None or hasattr(tokenizer, "detokenizer"):
        return tokenizer
    try:
        from transformers import PreTrainedTokenizerBase
    except ImportError:
        return tokenizer
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    return TokenizerWrapper(tokenizer)


def has_chat_template(tokenizer) -> bool:
    known = getattr(tokenizer, "has_chat_template", None)  # mlx-lm's TokenizerWrapper says
    if isinstance(known, bool):
        return known
    return getattr(tokenizer, "chat_template", None) is not None


def unread_template_variables(tokenizer, names) -> list:
    """Of `names` (chat template variables), those the tokenizer's chat template never mentions,
    so that setting them changes nothing (reasoning_effort for a model without reasoning); [] when
    the template's text is not known."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: any of them may be the one used
        template = " ".join(t for t in template.values() if isinstance(t, str))
    if not isinstance(template, str):
        return []
    return [name for name in names if name not in template]


def unread_template_note(tokenizer, names) -> str:
    """What to tell a user who set chat template variables `names` that the template never reads
    (`unread_template_variables`), or ""."""
    unread = unread_template_variables(tokenizer, names)
    if not unread:
        return ""
    return (f"this model's chat template does not read {', '.join(unread)}: "
            f"{'it changes' if len(unread) == 1 else 'they change'} nothing")


# What mlxspec passes to a chat template itself: chat_template_kwargs may not set these.
TEMPLATE_OWN = ("messages", "conversation", "tools", "add_generation_prompt", "tokenize", "return_dict",
                "continue_final_message", "chat_template")


def check_template_kwargs(kwargs) -> dict:
    """Extra variables for the chat template (e.g. {"enable_thinking": False}): a dict with string
    keys, none of them one mlxspec sets itself. None is {}."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidArgumentError(f"chat_template_kwargs must be an object of template variables, e.g. "
                                   f"{{\"enable_thinking\": false}}, got {shown(kwargs)}")
    own = [k for k in kwargs if k in TEMPLATE_OWN]
    if own:
        raise InvalidArgumentError(f"chat_template_kwargs may not set {', '.join(own)}: mlxspec passes "
                                   f"{', '.join(TEMPLATE_OWN)} to the template itself")
    return dict(kwargs)


def encode_prompt(prompt, tokenizer, vocab_size: int, tools: Optional[list] = None,
                  template_kwargs: Optional[dict] = None, continue_final: bool = False) -> List[int]:
    """str (used as is), list[int] (or a 1-D integer array), or a list of chat messages
    {"role", "content"} -> ids. `tools` (OpenAI's function tools, checked by
    `mlxspec.tools.check_tools`) go to the chat template with the messages, and so do
    `template_kwargs` (checked by `check_template_kwargs`); `continue_final`: see `render_chat`."""
    if not isinstance(prompt, (str, list, tuple)) and getattr(prompt, "ndim", None) == 1:
        prompt = prompt.tolist()  # an mx.array or numpy array of token ids, as mlx-lm takes them
    chat = is_chat(prompt)
    for name, given in (("tools", tools), ("chat_template_kwargs", template_kwargs),
                        ("continue_final_message", continue_final)):
        if given and not chat:
            raise InvalidArgumentError(f"{name} need a prompt of chat messages (the chat template renders them); "
                                       f"got a {'string' if isinstance(prompt, str) else 'token-id'} prompt")
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidArgumentError("prompt is empty: give a non-empty string, token-id list or message list")
        check_text(prompt)
        if tokenizer is None:
            raise InvalidArgumentError("a text prompt needs a tokenizer; this engine has none (pass token ids)")
        ids = encode_text(prompt, tokenizer)
    elif chat:
        ids = tokenizer.encode(render_chat(prompt, tokenizer, tools, template_kwargs, continue_final),
                               add_special_tokens=False)
    elif isinstance(prompt, (list, tuple)):
        if not prompt:
            raise InvalidArgumentError("prompt is empty: give a non-empty string, token-id list or message list")
        ids = as_token_ids(prompt)
    else:
        shape = f" of shape {tuple(prompt.shape)}" if getattr(prompt, "shape", None) is not None else ""
        raise InvalidArgumentError(f"prompt must be a str, a list (or 1-D array) of token ids or a list of chat "
                                   f"messages, got {type(prompt).__name__}{shape}")
    ids = [int(t) for t in ids]
    if not ids:
        raise InvalidArgumentError("prompt encodes to no tokens: give a longer prompt")
    check_in_vocab(ids, vocab_size)
    return ids


def as_token_ids(values, what: str = "prompt") -> List[int]:
    """`values` (a list of token ids) as ints, numpy's and mlx's integer scalars too;
    InvalidArgumentError naming `what` and the first that is not an integer."""
    ids = [as_integer(t) for t in values]
    if None in ids:
        i = ids.index(None)
        raise InvalidArgumentError(f"{what} token {i} is {shown(values[i])}; token ids must be integers")
    return ids


def check_in_vocab(ids: List[int], vocab_size: int, what: str = "prompt") -> None:
    """InvalidArgumentError naming `what` and the first of `ids` outside [0, vocab_size)."""
    bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
    if bad is not None:
        raise InvalidArgumentError(f"{what} token id {bad} is outside the vocabulary: ids must be in [0, {vocab_size})")


def encode_text(text: str, tokenizer) -> List[int]:
    """A text prompt's ids: with the tokenizer's special tokens (its BOS), unless the text already
    starts with its BOS (a template rendered by hand), which would then be there twice."""
    bos = getattr(tokenizer, "bos_token", None)
    return tokenizer.encode(text, add_special_tokens=bos is None or not text.startswith(bos))


def is_chat(prompt) -> bool:
    """A prompt of chat messages (a non-empty list of dicts)."""
    return isinstance(prompt, (list, tuple)) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def render_chat(prompt: list, tokenizer, tools: Optional[list] = None, template_kwargs: Optional[dict] = None,
                continue_final: bool = False) -> str:
    """Chat messages -> the text their chat template makes of them, generation prompt included;
    with `continue_final`, ending inside the last message, the assistant's, which the answer
    continues (a prefill: vLLM's continue_final_message, Anthropic's last assistant message)."""
    if tokenizer is None:
        raise InvalidArgumentError("chat messages need a tokenizer with a chat template; this engine has none")
    if not has_chat_template(tokenizer):
        raise InvalidArgumentError(
            "this model's tokenizer has no chat template, so chat messages cannot be formatted; send the "
            "text itself as a string prompt (mlxspec generate does when the model has no template; the "
            "server's /v1/completions takes it)")
    if continue_final and prompt[-1].get("role") != "assistant":  # (chat prompts are never empty)
        raise InvalidArgumentError(f"continue_final_message needs the last message to be the assistant's (the text "
                                   f"the answer continues), got role {prompt[-1].get('role')!r}")
    messages = []
    for i, m in enumerate(prompt):
        if "role" not in m or "content" not in m:
            raise InvalidArgumentError(f"message {i} must have 'role' and 'content' keys, got {sorted(m)}")
        if m["content"] is None and m.get("tool_calls"):  # an assistant turn that only called tools
            messages.append(dict(m, content=""))
            continue
        messages.append(dict(m, content=check_text(_message_text(m["content"], i), f"message {i}'s content")))
    text = _render(tokenizer, messages, tools, template_kwargs, continue_final)
    if tools and text == _render(tokenizer, messages, None, template_kwargs, continue_final):
        raise InvalidArgumentError("tools: this model's chat template does not render tools, so the model "
                                   "would never see them; send the messages without tools (or describe the "
                                   "tools in a message), or use a model trained for tool calling")
    return text


def _render(tokenizer, messages: list, tools: Optional[list], template_kwargs: Optional[dict] = None,
            continue_final: bool = False) -> str:
    extra = dict(template_kwargs or {}, **({"tools": tools} if tools else {}))
    if continue_final:
        extra["continue_final_message"] = True

    def apply(msgs):
        return tokenizer.apply_chat_template(msgs, add_generation_prompt=not continue_final, tokenize=False,
                                             **extra)

    try:
        return apply(messages)
    except Exception as e:  # jinja2's errors: a template that refuses these messages, or is broken
        if (folded := fold_system(messages)) is not None:
            try:
                return apply(folded)
            except Exception:
                pass  # the first error is the one to tell
        raise InvalidArgumentError(f"the model's chat template failed on these messages "
                                   f"({type(e).__name__}: {one_line(e)}); e.g. some templates need roles to "
                                   f"alternate user/assistant, or send a string prompt") from None


def fold_system(messages: list) -> Optional[list]:
    """`messages` with a leading system message put before the first user message's text, as
    Gemma 3's template does itself (Gemma 2's refuses a system role); None when they do not start
    with a system message followed by a user message."""
    if len(messages) < 2 or messages[0].get("role") != "system" or messages[1].get("role") != "user":
        return None
    first = dict(messages[1], content=f"{messages[0]['content']}\n\n{messages[1]['content']}")
    return [first, *messages[2:]]


def check_endings(stop_token_ids, ignore_eos, min_tokens, max_tokens: int, vocab_size: int) -> tuple:
    """vLLM's (stop_token_ids, ignore_eos, min_tokens), checked: token ids in the vocabulary that
    end the answer as EOS does; whether the model's EOS does not; how many tokens come before any
    of them may (at most max_tokens)."""
    ids = [] if stop_token_ids is None else stop_token_ids
    if not isinstance(ids, (list, tuple)) or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size
                                                 for t in ids):
        raise InvalidArgumentError(f"stop_token_ids must be a list of token ids in [0, {vocab_size}), "
                                   f"got {shown(stop_token_ids)}")
    if not isinstance(ignore_eos, bool):
        raise InvalidArgumentError(f"ignore_eos must be true or false, got {shown(ignore_eos)}")
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or not 0 <= min_tokens <= max_tokens:
        raise InvalidArgumentError(f"min_tokens must be an integer in [0, max_tokens = {max_tokens}], "
                                   f"got {shown(min_tokens)}")
    return sorted(set(ids)), ignore_eos, min_tokens


def check_line_limits(min_indent, soft_time_limit) -> dict:
    """llama.cpp's n_indent and t_max_predict_ms, as `Engine.stream` takes them, checked."""
    if isinstance(min_indent, bool) or not isinstance(min_indent, int) or min_indent < 0:
        raise InvalidArgumentError(f"min_indent must be an integer >= 0 (the spaces or tabs each line after the "
                                   f"first needs; 0: any), got {shown(min_indent)}")
    t = soft_time_limit
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t < float("inf")):
        raise InvalidArgumentError(f"soft_time_limit must be a number of seconds > 0 (after which the answer ends "
                                   f"at its next line end), or None, got {shown(soft_time_limit)}")
    return dict(min_indent=min_indent, soft_time_limit=soft_time_limit)


def check_prompt_cache_size(size) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgumentError(f"prompt_cache_size must be an integer >= 0 (earlier conversations whose caches "
                                   f"are kept), got {shown(size)}")
    return size


def check_prompt_cache_bytes(limit) -> Optional[int]:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise InvalidArgumentError(f"prompt_cache_bytes must be None or an integer >= 0 (bytes the parked "
                                   f"conversations may hold together), got {shown(limit)}")
    return limit


def check_fits(n_tokens: int, context: Optional[int], *, what: str = "the prompt",
               remedy: str = "shorten it") -> None:
    """ContextLengthError when a prompt of `n_tokens` does not fit a model's `context` (None: any does)."""
    if context is not None and n_tokens >= context:
        raise ContextLengthError(
            f"{what} has {n_tokens} tokens but the model's context is {context}, so at most {context - 1} fit "
            f"(one position is left for the answer); {remedy} or set "
            f"max_kv_size=<window> below it to decode on with a sliding window (the model then reads positions "
            f"past its trained context, as with mlx-lm's --max-kv-size)")


def as_integer(value) -> Optional[int]:
    """`value` as an int: Python's, numpy's and mlx's integer scalars; None for anything else, a
    bool (an int to Python, never a count or an id) and 5.7 included."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except (TypeError, ValueError):
        return None


def check_max_tokens(max_tokens) -> int:
    """An integer >= 1 (numpy and mlx integer scalars too, as token ids are taken)."""
    n = as_integer(max_tokens)
    if n is None or n < 1:
        unbounded = " (mlx-lm's -1, no limit, is not taken: give the most you want)" if n == -1 else ""
        raise InvalidArgumentError(f"max_tokens must be an integer >= 1, got {shown(max_tokens)}{unbounded}")
    return n


def check_num_draft(num_draft) -> Optional[int]:
    """None or "auto" -> None (cost model); else an int in [0, MAX_DRAFT]."""
    if num_draft is None or num_draft == "auto":
        return None
    if isinstance(num_draft, bool) or not isinstance(num_draft, int) or not 0 <= num_draft <= MAX_DRAFT:
        raise InvalidArgumentError(
            f"num_draft must be 'auto', None (JSON null) or an integer in [0, {MAX_DRAFT}] (0: plain decoding), got "
            f"{shown(num_draft)}")
    return num_draft


def check_tree(tree) -> int:
    """None or "auto" -> MAX_DRAFT (the cost model sizes trees up to it); "off" -> 0 (chains only);
    an int in [1, MAX_DRAFT] caps a tree's nodes."""
    if tree is None or tree == "auto":
        return MAX_DRAFT
    if tree == "off":
        return 0
    if isinstance(tree, bool) or not isinstance(tree, int) or not 1 <= tree <= MAX_DRAFT:
        raise InvalidArgumentError(
            f"tree must be 'auto', 'off', None (JSON null) or an integer in [1, {MAX_DRAFT}] (most nodes), "
            f"got {shown(tree)}")
    return tree


def check_drafter(drafter) -> str:
    """A drafter's name (`choices.DRAFTERS`); whether an engine has it is the engine's to say."""
    from .choices import DRAFTERS

    if drafter not in DRAFTERS:
        raise InvalidArgumentError(f"drafter must be one of {', '.join(DRAFTERS)}, got {shown(drafter)}")
    return drafter


def check_lookup(lookup) -> bool:
    if not isinstance(lookup, bool):
        raise InvalidArgumentError(f"lookup must be True or False, got {shown(lookup)}")
    return lookup


def check_stop(stop) -> List[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidArgumentError(f"stop must be a string or a list of strings, got {shown(stop)}")
    for i, s in enumerate(stop):
        if s == "":  # dropping it would quietly ignore what was asked for
            raise InvalidArgumentError(f"stop string {i} is empty; a stop string needs at least one character "
                                       "(leave it out to stop only at the end of the answer)")
    return [check_text(s, f"stop string {i}") for i, s in enumerate(stop)]


MAX_SEED = 2**64  # 64 bits of a seed key the random streams (`sampling.race_noise`): more would alias


def check_cancel(cancel):
    """A request's cancel signal: None, or something with `is_set()` (a threading.Event)."""
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InvalidArgumentError(f"cancel must be None or a threading.Event (anything with is_set()), "
                                   f"got {type(cancel).__name__}")
    return cancel


def check_seed(seed) -> Optional[int]:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < MAX_SEED:
        raise InvalidArgumentError(f"seed must be None or an integer >= 0 and < 2**64, got {shown(seed)}")
    return seed


# mlx-lm's keyword arguments for generate/stream_generate, and what answers each here.
MLX_LM_KEYWORDS = {
    "temp": "temperature=",
    "num_draft_tokens": "num_draft=",
    "draft_model": "Engine(target, tokenizer, draft_model) or mlxspec.load(target, draft)",
    "max_kv_size": "Engine(..., max_kv_size=) or mlxspec.load(..., max_kv_size=)",
    "kv_bits": "Engine(..., kv_bits=) or mlxspec.load(..., kv_bits=)",
    "kv_group_size": "Engine(..., kv_group_size=) or mlxspec.load(..., kv_group_size=)",
    "quantized_kv_start": "Engine(..., quantized_kv_start=) or mlxspec.load(..., quantized_kv_start=)",
    "prefill_step_size": "Engine(..., prefill_step=)",
    "prompt_cache": "nothing: the engine keeps the cache of its previous request and reuses the shared prefix",
    "sampler": "temperature=, top_p=, top_k=, min_p=, typical_p=, xtc_probability=, xtc_threshold= (the same "
               "rule must sample target and draft)",
    "logits_processors": "nothing yet: a processor would change the target's distribution, which speculation keeps",
    "verbose": "the stats of the result (r.stats) or of the last event",
}


# Other libraries' names for what `stream` takes under its own: (whose, what answers it here).
OTHER_KEYWORDS = {
    "max_new_tokens": ("Hugging Face's", "max_tokens="),
    "max_completion_tokens": ("OpenAI's", "max_tokens="),
    "max_output_tokens": ("OpenAI's", "max_tokens="),
    "stop_sequences": ("Anthropic's", "stop="),
    "eos_token_id": ("Hugging Face's", "stop_token_ids="),
    "do_sample": ("Hugging Face's", "temperature= (0: greedy, > 0: sampled)"),
    "random_seed": ("vLLM's", "seed="),
}


def check_no_other_options(options: dict, allowed) -> None:
    """Refuse keywords `stream` does not take, naming mlxspec's way where mlx-lm (or another
    library a user may come from) has the keyword, or the allowed name a typo is closest to."""
    if not options:
        return
    import difflib

    said = []
    for name in options:
        whose, hint = (("mlx-lm's", MLX_LM_KEYWORDS[name]) if name in MLX_LM_KEYWORDS
                       else OTHER_KEYWORDS.get(name, ("", "")))
        close = difflib.get_close_matches(str(name), list(allowed), n=1, cutoff=0.8) if not hint else []
        said.append(f"{name!r} ({whose}; here: {hint})" if hint else
                    f"{name!r} (did you mean {close[0]}=?)" if close else repr(name))
    raise InvalidArgumentError(f"unknown option{'s' if len(said) > 1 else ''} {', '.join(said)}; allowed: "
                               f"{', '.join(allowed)}")
