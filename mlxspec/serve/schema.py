"""OpenAI request bodies -> a checked `GenerationRequest`, or a 400 naming the bad field.

Only what can be checked without the model happens here (types, ranges, unsupported
features); the engine checks the rest (the prompt's length against the context, token
ids against the vocabulary) in the worker, before it generates anything. Fields the
OpenAI API defines but that change nothing here (`user`, `metadata`, `store`...) are
ignored; fields that would change the answer and are not implemented are refused. The
prompt's own checks (chat messages, completions' prompts) are in messages.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..dry import FIELDS as DRY_FIELDS, check_dry
from ..errors import InvalidArgumentError, shown as _show
from ..fim import check_suffix
from ..grammar import check_response_format
from ..prompts import (MAX_SEED, check_drafter, check_max_tokens, check_num_draft, check_seed, check_stop,
                       check_template_kwargs, check_text, check_tree, text_of)
from ..penalties import CONTEXT, check_penalty, check_repetition
from ..reasoning import EFFORTS
from ..sampling import REQUEST_FIELDS, check_logit_bias, validate as validate_sampling
from ..logprobs import MAX_TOP, is_top_count
from ..tools import check_tool_choice, check_tools
from .errors import checked, invalid, unsupported
from .messages import chat_messages, completion_prompts
from .options import ServeOptions

MAX_STOP = 16  # stop strings per request (OpenAI allows 4; editors sometimes send more)
MAX_CHOICES = 128  # choices per request: n (OpenAI's most) times the prompts of a completions batch
SAMPLING_DEFAULTS = REQUEST_FIELDS  # (typical_p: TGI's; XTC: mlx-lm's; top_n_sigma and mirostat: llama.cpp's)
TOP_K_OFF = -1  # vLLM's top_k for "off", read as the library's (and mlx-lm's) 0
MAX_TEMPERATURE = 2  # OpenAI's bound (the engine takes any finite temperature: a request past it is a typo)
# Fields other OpenAI-style servers (mlx-lm's, vLLM, llama.cpp, text-generation-inference) take that
# would change the answer, with the value that changes nothing: a client that sends another is told.
EXTENSIONS = {"repeat_penalty": 1.0, "tfs_z": 1.0, "length_penalty": 1.0,
              "use_beam_search": False, "guided_grammar": None, "grammar": "",  # (llama.cpp's "": none)
              "audio": None, "modalities": ["text"], "chat_template": None,
              "role_mapping": {}, "bad_words": [], "allowed_token_ids": None,
              "truncate_prompt_tokens": None}
# vLLM's fields for what OpenAI's response_format says (one of them, or response_format, per request).
GUIDED = {"guided_json": "json_schema", "guided_regex": "regex", "guided_choice": "choice"}
# mlx-lm's server names for what is chosen here otherwise (a draft model and an adapter are the server's to load).
RENAMED = {"num_draft_tokens": "send num_draft instead (tokens drafted per round, or \"auto\")",
           "draft_model": "the draft is loaded when the server starts (mlxspec serve --draft/--drafter); "
                          "a request may choose among those loaded with \"drafter\"",
           "adapters": "the target's adapter is applied when the server starts (mlxspec serve --adapter-path), "
                       "for every request"}


@dataclass
class GenerationRequest:
    kind: str  # "chat" or "completion"
    prompt: Any  # chat messages, a string, or token ids: what Engine.stream takes (the first prompt)
    options: Dict[str, Any] = field(default_factory=dict)  # keyword arguments of Engine.stream
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with `usage`
    model: Optional[str] = None  # the name the client asked for
    n: int = 1  # choices per prompt
    more_prompts: List[Any] = field(default_factory=list)  # a completions batch's other prompts
    echo: bool = False  # completions: the text (and logprobs) start with the prompt's; chat: the content
    # starts with the last message's when it is the assistant's (vLLM's), its logprobs not
    score_only: bool = False  # echo with max_tokens 0: the prompt alone, nothing generated
    best_of: int = 1  # completions: generations per prompt, of which the n best are returned (>= n)
    ranking_logprobs: bool = False  # logprobs computed only to rank best_of's generations, not shown

    @property
    def prompts(self) -> List[Any]:
        return [self.prompt] + self.more_prompts

    @property
    def per_prompt(self) -> int:
        """Generations per prompt: n, or best_of when more."""
        return max(self.n, self.best_of)

    def runs(self) -> List[tuple]:
        """(prompt, Engine.stream options) per generation, in OpenAI's order: each prompt's in
        turn. With a seed, generation j of a prompt samples with seed + j: each differs, each
        reproducible."""
        seed = self.options.get("seed")
        return [(prompt, self.options if j == 0 or seed is None else dict(self.options, seed=(seed + j) % MAX_SEED))
                for prompt in self.prompts for j in range(self.per_prompt)]

    @property
    def tools(self) -> Optional[list]:
        """The tools shown to the model (options["tools"]): its calls are read back as `tool_calls`."""
        return self.options.get("tools")

    @property
    def one_call(self) -> bool:
        """parallel_tool_calls false: the answer's first tool call alone is read back."""
        return self.options.get("parallel_tool_calls") is False

    @property
    def logprobs(self) -> bool:
        """Whether the answer carries its tokens' logprobs (options["logprobs"]: how many alternatives)."""
        return self.options.get("logprobs") is not None

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"


def parse_chat(body: dict, defaults: Optional[ServeOptions] = None) -> GenerationRequest:
    """POST /v1/chat/completions body -> GenerationRequest; `defaults` fill the fields left out."""
    _refuse_unsupported(body, chat=True)
    req = _common(body, "chat", chat_messages(body.get("messages")), defaults or ServeOptions())
    tools = checked(check_tools, body.get("tools"), "tools")
    # "required" and a named function are forced by a grammar in the model's call format (the engine's)
    choice = checked(lambda c: check_tool_choice(c, tools), body.get("tool_choice"), "tool_choice")
    parallel = flag(body, "parallel_tool_calls", True)
    if tools and choice != "none":  # "none": the model is not shown them, so it cannot call them
        req.options["tools"] = tools
        if choice not in (None, "auto"):
            req.options["tool_choice"] = choice
        if not parallel:  # one call at most (the engine ends the answer with it; `one_call` reads one)
            req.options["parallel_tool_calls"] = False
    # OpenAI's Predicted Outputs: text the answer is expected to largely repeat, drafted from
    if body.get("prediction") is not None:
        req.options["prediction"] = _prediction(body["prediction"])
    # vLLM's prefill: the answer continues the last (assistant) message instead of a new turn
    if _continues(body):
        req.options["continue_final_message"] = True
    # vLLM's chat echo: the answer's content starts with the last message's, when that is the assistant's
    req.echo = flag(body, "echo", False)
    # vLLM's and mlx-lm's template variables ({"enable_thinking": false}), over the server's (--chat-template-args)
    kwargs = dict((defaults or ServeOptions()).chat_template_args or {})
    # OpenAI's reasoning_effort: the template variable of that name (gpt-oss's template reads it, as
    # vLLM passes it); a request's own chat_template_kwargs still win
    effort = body.get("reasoning_effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise invalid(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {_show(effort)}",
                          "reasoning_effort")
        kwargs["reasoning_effort"] = effort
    kwargs.update(checked(check_template_kwargs, body.get("chat_template_kwargs"), "chat_template_kwargs"))
    if kwargs:
        req.options["chat_template_kwargs"] = kwargs
    # OpenAI's chat: logprobs true, and top_logprobs (0..20) alternatives per token with it
    top = body.get("top_logprobs")
    if flag(body, "logprobs", False):
        req.options["logprobs"] = 0 if top is None else check_top_logprobs(top)
    elif top is not None:
        raise invalid(f"top_logprobs needs \"logprobs\": true, got top_logprobs={_show(top)} without it",
                      "top_logprobs")
    return req


def check_top_logprobs(top) -> int:
    """OpenAI's top_logprobs: alternatives per token, 0..MAX_TOP (a 400 naming it otherwise)."""
    if not is_top_count(top):
        raise invalid(f"top_logprobs must be an integer in 0..{MAX_TOP}, got {_show(top)}", "top_logprobs")
    return top


def _continues(body: dict) -> bool:
    """vLLM's continue_final_message (with add_generation_prompt false, or left out)."""
    keep_going = flag(body, "continue_final_message", False)
    new_turn = flag(body, "add_generation_prompt", True)
    if keep_going and body.get("add_generation_prompt") is True:
        raise invalid("continue_final_message continues the last message, and add_generation_prompt starts a new "
                      "turn: send add_generation_prompt false (or leave it out) with it", "add_generation_prompt")
    if not new_turn and not keep_going:
        raise unsupported("add_generation_prompt false alone is not supported by this server (the model would "
                          "write its own turn header); send continue_final_message true to continue the last "
                          "assistant message", "add_generation_prompt")
    return keep_going


def parse_completion(body: dict, defaults: Optional[ServeOptions] = None) -> GenerationRequest:
    """POST /v1/completions body -> GenerationRequest."""
    _refuse_unsupported(body, chat=False)
    echo = flag(body, "echo", False)
    # OpenAI's way to score a text: echo it with max_tokens 0 (one token is generated, and dropped)
    score_only = echo and body.get("max_tokens") == 0 and not isinstance(body.get("max_tokens"), bool)
    if score_only:
        body = dict(body, max_tokens=1)
    prompts = completion_prompts(body.get("prompt"))
    req = _common(body, "completion", prompts[0], defaults or ServeOptions())
    req.more_prompts, req.echo, req.score_only = prompts[1:], echo, score_only
    req.best_of = _best_of(body, req.n, req.stream)
    if body.get("suffix") is not None:  # fill in the middle: each prompt is the text before the insertion point
        for i, prompt in enumerate(prompts):
            checked(lambda p: check_suffix(body["suffix"], p), prompt,
                    "suffix" if len(prompts) == 1 else f"prompt[{i}]")
        req.options["suffix"] = checked(lambda text: check_text(text, "suffix"), body["suffix"], "suffix")
    _check_choices(req)
    lp = body.get("logprobs")
    if lp is not None:  # the legacy API's: how many alternatives per token
        if not is_top_count(lp):
            raise invalid(f"logprobs must be an integer in 0..{MAX_TOP} (alternatives per token) or null, got "
                          f"{_show(lp)}", "logprobs")
        req.options["logprobs"] = lp
        if echo:  # the prompt's tokens too, scored by the prefill
            req.options["prompt_logprobs"] = lp
    elif req.best_of > req.n:  # best_of ranks by them
        req.options["logprobs"], req.ranking_logprobs = 0, True
    return req


# -- shared fields ---------------------------------------------------------------------------------
def _common(body: dict, kind: str, prompt, defaults: ServeOptions) -> GenerationRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(f"model must be a string, got {_show(model)}", "model")
    stream = flag(body, "stream", False)
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise invalid(f"stream_options must be an object like {{\"include_usage\": true}}, got {_show(stream_options)}",
                      "stream_options")
    if stream_options is not None and not stream:  # as OpenAI refuses it: it would change nothing here
        raise invalid("stream_options is only allowed when stream is true: send \"stream\": true with it, or leave "
                      "it out", "stream_options")
    include_usage = flag(stream_options or {}, "include_usage", False, "stream_options.include_usage")
    return GenerationRequest(kind, prompt, _options(body, defaults), stream=stream, include_usage=include_usage,
                             model=model, n=_choices(body))


def _choices(body: dict) -> int:
    """n: choices per prompt, 1..MAX_CHOICES (generated one after another)."""
    n = body.get("n")
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise invalid(f"n must be an integer in 1..{MAX_CHOICES} (choices per prompt), got {_show(n)}", "n")
    return n


def _check_choices(req: GenerationRequest) -> None:
    count = req.per_prompt * len(req.prompts)
    if count > MAX_CHOICES:
        name = "best_of" if req.best_of > req.n else "n"
        raise invalid(f"this request asks for {count} generations ({len(req.prompts)} prompts x {name}="
                      f"{req.per_prompt}); at most {MAX_CHOICES} per request: send fewer prompts or a smaller "
                      f"{name}", name)


def _best_of(body: dict, n: int, stream: bool) -> int:
    """OpenAI's best_of: that many generations per prompt, the n with the highest log-probability
    per token returned (n..MAX_CHOICES; not streamed)."""
    best_of = body.get("best_of")
    if best_of is None:
        return n
    if isinstance(best_of, bool) or not isinstance(best_of, int) or not n <= best_of <= MAX_CHOICES:
        raise invalid(f"best_of must be an integer in n..{MAX_CHOICES} (n={n}: generations per prompt, of which "
                      f"the n best are returned), got {_show(best_of)}", "best_of")
    if best_of > n and stream:
        raise invalid("best_of greater than n cannot be streamed (the best are known once all are done); send "
                      "stream false, or best_of equal to n", "best_of")
    return best_of


def _options(body: dict, defaults: ServeOptions) -> Dict[str, Any]:
    """Engine.stream keywords, each checked by the engine's own rules so messages match the library's."""
    def check_limit(name):  # the library's rule, in the words of the field the client sent
        def check(value):
            try:
                return check_max_tokens(value)
            except InvalidArgumentError as e:
                raise InvalidArgumentError(str(e).replace("max_tokens", name, 1)) from None
        return check

    # Two names for one limit (OpenAI deprecates max_tokens): both are checked, and both given must
    # agree, so neither is silently passed over.
    limits = {name: checked(check_limit(name), body[name], name) for name in ("max_tokens", "max_completion_tokens")
              if body.get(name) is not None}
    if len(set(limits.values())) > 1:
        raise invalid(f"max_tokens ({limits['max_tokens']}) and max_completion_tokens "
                      f"({limits['max_completion_tokens']}) disagree: they are the same limit; send "
                      f"max_completion_tokens alone", "max_tokens")
    limit = limits.get("max_completion_tokens", limits.get("max_tokens", defaults.max_tokens))
    opts = {"max_tokens": limit}
    sampling = {}
    for key, off in SAMPLING_DEFAULTS.items():
        value = body.get(key)
        if value is None:
            value = defaults.temperature if key == "temperature" else off
        if isinstance(value, bool):
            raise invalid(f"{key} must be a number, got {_show(value)}", key)
        if key == "top_k":
            value = _top_k(value)
        # One field at a time (the others at their neutral value), so the error names its field.
        checked(lambda v, key=key: validate_sampling(**dict(SAMPLING_DEFAULTS, **{key: v})), value, key)
        if key == "temperature" and body.get(key) is not None and value > MAX_TEMPERATURE:
            raise invalid(f"temperature must be in 0..{MAX_TEMPERATURE} (0 = greedy), got {_show(value)}", key)
        sampling[key] = value
    opts.update(sampling)
    opts["seed"] = checked(check_seed, body.get("seed"), "seed")
    stop = checked(check_stop, body.get("stop"), "stop")
    if len(stop) > MAX_STOP:
        raise invalid(f"stop takes at most {MAX_STOP} strings, got {len(stop)}", "stop")
    opts["stop"] = stop
    opts["speculative"] = flag(body, "speculative", True)
    opts["num_draft"] = checked(check_num_draft, body.get("num_draft"), "num_draft")
    # The engine's own settings, per request when given (None: the server's); whether this engine
    # has the drafter asked for is the engine's to say.
    if body.get("tree") is not None:
        checked(check_tree, body["tree"], "tree")
        opts["tree"] = body["tree"]  # as given: Engine.stream reads "auto" / "off" / N itself
    if body.get("lookup") is not None:
        opts["lookup"] = _on_off(body["lookup"], "lookup")
    if body.get("drafter") is not None:
        opts["drafter"] = checked(check_drafter, body["drafter"], "drafter")
    fmt = _response_format(body)
    if fmt is not None:
        opts["response_format"] = fmt
    for key in ("presence_penalty", "frequency_penalty"):
        penalty = checked(lambda v, key=key: check_penalty(v, key), body.get(key), key)
        if penalty:
            opts[key] = penalty
    # mlx-lm's server's repetition penalty (0 or 1: off), over its last repetition_context_size tokens
    # (each checked under its own name, so that an error names the field that is wrong)
    context = body.get("repetition_context_size")
    context = CONTEXT if context is None else checked(lambda v: check_repetition(None, v)[1], context,
                                                      "repetition_context_size")
    repetition, _ = checked(lambda v: check_repetition(v, context), body.get("repetition_penalty"),
                            "repetition_penalty")
    if repetition is not None:
        opts.update(repetition_penalty=repetition, repetition_context_size=context)
    # llama.cpp's DRY, each field checked alone so that an error names it
    dry = {key: body[key] for key in DRY_FIELDS if body.get(key) is not None}
    for key, value in dry.items():
        checked(lambda v, key=key: check_dry(**dict(DRY_FIELDS, **{key: v})), value, key)
    opts.update(dry)
    # vLLM's: more ending tokens, EOS ignored, a minimum length (the ids' range is the engine's to check)
    if body.get("stop_token_ids") is not None:
        opts["stop_token_ids"] = body["stop_token_ids"]
    if body.get("ignore_eos") is not None:
        opts["ignore_eos"] = flag(body, "ignore_eos", False)
    if body.get("min_tokens") is not None:
        opts["min_tokens"] = body["min_tokens"]
    if flag(body, "include_stop_str_in_output", False):
        opts["include_stop_str_in_output"] = True
    # Its shape here; whether its ids are in the vocabulary is the engine's to say.
    bias = checked(lambda b: check_logit_bias(b, None), body.get("logit_bias"), "logit_bias")
    if bias:
        opts["logit_bias"] = bias
    return opts


def _top_k(value) -> int:
    """top_k in the HTTP terms: vLLM's -1 ("off") is the library's 0."""
    if not isinstance(value, int) or value < TOP_K_OFF:
        raise invalid(f"top_k must be an integer >= 0, or {TOP_K_OFF} for off (0 is off too), got {_show(value)}",
                      "top_k")
    return max(value, 0)


def _response_format(body: dict) -> Optional[dict]:
    """The grammar asked for, checked (None for free text): OpenAI's response_format, or one of
    vLLM's guided_json / guided_regex / guided_choice. The schema itself is compiled by the
    engine, in the worker (a large one takes a while), which names response_format when it refuses."""
    fmt = body.get("response_format")
    given = [key for key in GUIDED if body.get(key) is not None]
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        given.insert(0, "response_format")
    if len(given) > 1:
        raise invalid(f"send one of response_format, {', '.join(GUIDED)}; got {', '.join(given)}", given[1])
    if not given or given[0] == "response_format":
        return checked(check_response_format, fmt, "response_format")
    key = given[0]
    value = body[key]
    if key == "guided_json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as e:
                raise invalid(f"guided_json must be a JSON schema (an object, or a string of one): {e}", key) from None
        value = {"type": "json_schema", "json_schema": {"name": key, "schema": value}}
    else:
        value = {"type": GUIDED[key], GUIDED[key]: value}
    return checked(lambda v: check_response_format(v, key), value, key)


def _prediction(value) -> str:
    """OpenAI's {"type": "content", "content": text or text parts} -> the text."""
    text = text_of(value.get("content")) if isinstance(value, dict) and value.get("type") == "content" else None
    if text is None:
        raise invalid(f'prediction must be {{"type": "content", "content": ...}}, its content a string or a list of '
                      f'{{"type": "text", "text": ...}} parts (what the answer is expected to largely repeat), '
                      f'got {_show(value)}', "prediction")
    return text


def flag(body: dict, key: str, default: bool, param: Optional[str] = None) -> bool:
    """`body[key]`, true or false (null, or left out: `default`), else a 400 naming `param` or `key`."""
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid(f"{param or key} must be true or false, got {_show(value)}", param or key)
    return value


def _on_off(value, key: str) -> bool:
    """A switch given as JSON's true/false or as its `serve` flag's on/off."""
    if isinstance(value, str) and value.lower() in ("on", "off"):
        return value.lower() == "on"
    if not isinstance(value, bool):
        raise invalid(f"{key} must be true or false (or \"on\" or \"off\", as serve --{key} takes), got "
                      f"{_show(value)}", key)
    return value


# -- what is refused -------------------------------------------------------------------------------
def _refuse_unsupported(body: dict, *, chat: bool) -> None:
    best_of, n = body.get("best_of"), body.get("n")
    if chat and (best_of is not None and best_of != (1 if n is None else n) or isinstance(best_of, bool)):
        raise unsupported(f"best_of other than n is not supported on the chat endpoint (OpenAI's has none; the "
                          f"completions endpoint takes it), got {_show(best_of)}", "best_of")
    if body.get("functions"):
        raise unsupported("functions (OpenAI's deprecated function calling) is not supported by this server; "
                          "send tools instead", "functions")
    if body.get("function_call") not in (None, "none"):
        raise unsupported("function_call (deprecated) is not supported by this server; send tool_choice instead",
                          "function_call")
    if not chat and body.get("tools"):
        raise unsupported("tools need the chat endpoint (POST /v1/chat/completions), where the chat template "
                          "shows them to the model", "tools")
    for key, neutral in EXTENSIONS.items():  # other servers' sampling fields: refused, not silently ignored
        value = body.get(key)
        if value is not None and not _neutral(value, neutral):  # (said in the client's terms: null, false, [])
            allowed = "null" if neutral is None else f"null or {json.dumps(neutral)}"
            raise unsupported(f"{key} is not supported by this server (only {allowed}), got {_show(value)}", key)
    for key, instead in RENAMED.items():
        if body.get(key) is not None:
            raise unsupported(f"{key} is not supported by this server: {instead}; got {_show(body[key])}", key)


def _neutral(value, neutral) -> bool:
    if isinstance(neutral, (int, float)) and not isinstance(neutral, bool):  # 1 and 1.0 alike
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == neutral
    return type(value) is type(neutral) and value == neutral
