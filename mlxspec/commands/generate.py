"""`mlxspec generate PROMPT`: stream one answer with speculative decoding, then one stats line."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import textwrap
import threading

from ..errors import InvalidArgumentError
from ..prompts import has_chat_template, unread_template_note
from ..reasoning import chat_starts_inside, make_splitter, split_whole, thinking_markers
from ..stats import acceptance_text, plural
from .argtypes import (at_least_one, count, finite, look_back, min_p, non_negative, positive, probability, seed,
                       top_p, xtc_threshold)
from . import modelargs
from .modelargs import add_distributed_arg, add_drafting_args, add_model_args, add_template_args, quiet_unless_main


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="generate text for one prompt with speculative decoding",
        description=textwrap.fill((
            "Generate an answer to PROMPT. A drafter (an EAGLE head reading the target's features, a "
            "small model, or an n-gram drafter) proposes tokens and the target verifies them in one "
            "pass, so the output is what the target alone "
            "would produce (greedy: token for token, up to rounding at near-ties in low precision) or "
            "sample (the same distribution). Text streams to stdout; stderr gets one line on what was "
            "loaded before it and one stats line (the prompt's tokens and tokens/s, then tokens/s, "
            "acceptance, tokens per target pass, peak memory) after it. A thinking model's reasoning "
            "(Qwen3's and DeepSeek-R1's <think> block, gpt-oss's analysis channel) goes to stderr, "
            "dimmed on a terminal, its answer to stdout; --json gives them as 'reasoning' and 'text'. "
            "Without --pair or --target the offline 'demo' pair is used."
        ), width=79),
        epilog="examples:\n  mlxspec generate 'What is the capital of France?'\n"
               "  mlxspec generate --pair qwen2.5-7b --temperature 0.7 --seed 1 'Write a haiku'\n"
               "  mlxspec generate --temperature 1 --min-p 0.05 --xtc-probability 0.5 --dry-multiplier 0.8 'A story'\n"
               "  mlxspec generate --target model.gguf --drafter ngram --json 'Hello'\n"
               "  mlxspec generate --json-schema cat.schema.json 'Describe a cat as JSON'\n"
               "  mlxspec generate --target Qwen3-8B-Q4_K_M.gguf --chat-template-args '{\"enable_thinking\": false}' 'Hi'\n"
               "  mlxspec generate --pair qwen2.5-coder-7b --suffix \"$(cat after.py)\" \"$(cat before.py)\"\n"
               "  mlxspec generate --prediction \"$(cat app.py)\" \"Rename foo to bar: $(cat app.py)\"",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("prompt", metavar="PROMPT", help="the user message ('-' reads it from stdin; the newline "
                   "that ends it is dropped, unless the text goes without the chat template)")
    add_model_args(p)
    add_drafting_args(p)
    p.add_argument("--max-tokens", type=positive, default=256, metavar="N", help="tokens to generate at most (default: 256)")
    p.add_argument("--temperature", type=non_negative, default=0.0, metavar="T", help="0 is greedy (default: 0)")
    p.add_argument("--top-p", type=top_p, default=1.0, metavar="P", help="nucleus threshold in (0, 1]; 1 disables (default: 1)")
    p.add_argument("--top-k", type=count, default=0, metavar="K", help="keep the K most likely tokens; 0 disables (default: 0)")
    p.add_argument("--min-p", type=min_p, default=0.0, metavar="P", help="drop tokens below P x the top probability; 0 disables (default: 0)")
    p.add_argument("--typical-p", type=top_p, default=1.0, metavar="P",
                   help="locally typical sampling: keep the tokens whose surprise is nearest the entropy, up to "
                        "mass P; 1 disables (default: 1)")
    p.add_argument("--top-n-sigma", type=finite, default=0.0, metavar="N",
                   help="keep the tokens whose logit is at least the top one less N standard deviations of the "
                        "logits; 0 or less disables (default: 0)")
    p.add_argument("--xtc-probability", type=probability, default=0.0, metavar="P",
                   help="XTC (exclude top choices): at each token, with chance P, drop every token above "
                        "--xtc-threshold but the least likely of them (newline and EOS stay); 0 disables (default: 0)")
    p.add_argument("--xtc-threshold", type=xtc_threshold, default=0.1, metavar="X",
                   help="XTC's threshold in [0, 0.5] (default: 0.1)")
    p.add_argument("--mirostat", type=int, choices=(0, 1, 2), default=0, metavar="{0,1,2}",
                   help="mirostat, llama.cpp's version 1 or 2, in place of --top-k, --top-p, --min-p, --typical-p, "
                        "--top-n-sigma and XTC: it keeps the text's surprise near --mirostat-ent bits; 0 disables "
                        "(default: 0)")
    p.add_argument("--mirostat-ent", type=non_negative, default=5.0, metavar="TAU",
                   help="mirostat's target surprise in bits (default: 5)")
    p.add_argument("--mirostat-lr", type=non_negative, default=0.1, metavar="ETA",
                   help="mirostat's learning rate (default: 0.1)")
    p.add_argument("--dry-multiplier", type=non_negative, default=0.0, metavar="M",
                   help="DRY: where the text ends with a repeat of N >= --dry-allowed-length tokens, the token "
                        "that followed it before loses M x --dry-base ** (N - --dry-allowed-length) of its logit; "
                        "0 disables (default: 0; 0.8 is the usual setting)")
    p.add_argument("--dry-base", type=at_least_one, default=1.75, metavar="B", help="DRY's base (default: 1.75)")
    p.add_argument("--dry-allowed-length", type=positive, default=2, metavar="N",
                   help="the longest repeat DRY lets be (default: 2)")
    p.add_argument("--dry-penalty-last-n", type=look_back, default=-1, metavar="N",
                   help="the tokens DRY looks back over, prompt included; -1 all, 0 disables (default: -1)")
    p.add_argument("--dry-sequence-breaker", action="append", default=None, metavar="TEXT", dest="dry_breakers",
                   help="a string that ends a repeat (a token holding it is never penalised); repeat for several; "
                        "replaces the defaults (newline, ':', '\"', '*'); 'none' for none")
    p.add_argument("--seed", type=seed, default=None,
                   help="random seed for sampling (default: none). The same seed gives the same text "
                        "whatever drafts it, plain decoding included (README: Seeds)")
    p.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="end the answer before TEXT (the text is not printed); repeat for several")
    p.add_argument("--system", "--system-prompt", metavar="TEXT", default=None,
                   help="a system message before PROMPT (default: the chat template's own, if any)")
    p.add_argument("--no-chat-template", action="store_true",
                   help="send PROMPT as raw text, without the chat template (default: with it, if the model has one)")
    add_template_args(p)
    p.add_argument("--suffix", metavar="TEXT", default=None,
                   help="fill in the middle: PROMPT is the text before the insertion point (raw, without the "
                        "chat template) and TEXT the text after it; the model writes what goes between. Needs "
                        "a code model trained for it (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, Codestral)")
    p.add_argument("--prediction", metavar="TEXT", default=None,
                   help="text the answer is expected to largely repeat, such as the file an edit rewrites "
                        "(OpenAI's Predicted Outputs): rounds draft from it where the answer follows it, "
                        "the answer stays the target's; the stats line says how much of it the answer holds")
    p.add_argument("--json", action="store_true", help="print one JSON object (text and stats) instead of streaming")
    grammar = p.add_mutually_exclusive_group()
    grammar.add_argument("--json-schema", metavar="SCHEMA", default=None,
                         help="make every token of the answer follow a JSON schema: the schema itself or a "
                              "file holding it ('{\"type\": \"object\"}': any JSON object); the output is "
                              "still the target's, constrained")
    grammar.add_argument("--regex", metavar="REGEX", default=None,
                         help="make the answer match a regular expression (from its start)")
    add_distributed_arg(p)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.prompt == "-" and args.distributed:  # it would wait forever: stdin never ends there
        raise InvalidArgumentError("PROMPT '-' (stdin) does not work with --distributed: mlx.launch hands stdin to "
                                   "every rank and never closes it; give the text itself, e.g. \"$(cat prompt.txt)\"")
    # Checked before loading (seconds to minutes): on every rank alike when the target is sharded.
    text = _prompt_text(args.prompt)
    _check_options(args)
    fmt = _response_format(args)
    for note in modelargs.drafting_notes(args):
        print(f"note: {note}", file=sys.stderr)
    drafting = modelargs.drafting_options(args)  # the engine keeps lookup
    if args.draft is None and (args.drafter or _pair_drafter(args)) == "eagle":
        # one answer, drafted by the head: the pair's draft model would load for nothing
        drafting.update(drafter="eagle", draft="none")
    engine = modelargs.load_engine(args, **drafting)
    quiet_unless_main(engine)
    # as mlx-lm: no template, raw text (and the text before the insertion point is raw text)
    raw = args.no_chat_template or args.suffix is not None or not has_chat_template(engine.tokenizer)
    if raw and args.system is not None:
        raise InvalidArgumentError("--system needs a chat template to place it and this model has none; put the "
                                   "text in PROMPT itself")
    template_kwargs = modelargs.template_options(args)
    if raw and template_kwargs:
        raise InvalidArgumentError("--chat-template-args and --reasoning-effort are chat template variables, and "
                                   "PROMPT goes without the template here; leave them out")
    if unread := unread_template_note(engine.tokenizer, template_kwargs or {}):
        print(f"note: {unread} here", file=sys.stderr)
    system = [] if args.system is None else [{"role": "system", "content": args.system}]
    if args.prompt == "-" and not raw:
        # the newline that ends what `echo` or a file piped in: not part of the message (raw text keeps it,
        # where the model continues after it)
        text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    prompt = text if raw else system + [{"role": "user", "content": text}]
    options = dict(max_tokens=args.max_tokens, **_sampling(args), **_dry(args), seed=args.seed,
                   num_draft=args.num_draft, stop=args.stop, response_format=fmt, suffix=args.suffix,
                   chat_template_kwargs=template_kwargs,
                   prediction=args.prediction)
    # a thinking model's reasoning apart from its answer, as the server splits them
    splitter = None if raw else _reasoning_splitter(engine.tokenizer, prompt, template_kwargs)
    if args.json:
        cancel = threading.Event()
        with _ctrl_c_sets(cancel):  # Ctrl-C: the object still comes, with what was generated
            result = engine.generate(prompt, cancel=cancel, **options)
        text, extra = result.text, {}
        if splitter is not None:
            reasoning, text = split_whole(splitter, text)
            extra = {"reasoning": reasoning}
        print(json.dumps({"text": text, **extra, "finish_reason": result.finish_reason,
                          "stats": dict(result.stats), "pair": engine.pair_name,
                          "target": _describe(engine.target_info), "draft": _describe(engine.draft_info),
                          "head": _head(engine)}))
        _note_context(result.stats, args.max_tokens, getattr(engine, "context", None))
        return 130 if cancel.is_set() else 0
    no_template = raw != args.no_chat_template and args.suffix is None
    note = "; the model has no chat template: PROMPT is sent as raw text" if no_template else ""
    print(load_line(engine) + note, file=sys.stderr, flush=True)
    stats = _stream(engine, prompt, options, splitter)
    print(file=sys.stdout, flush=True)
    if stats:
        print(stats_line(stats), file=sys.stderr)
        _note_context(stats, args.max_tokens, getattr(engine, "context", None))
    return 0


def _note_context(stats, max_tokens: int, context) -> None:
    """Said when the model's context, not --max-tokens, ended the answer (it ends as "length" both ways)."""
    prompt, tokens = int(_stat(stats, "prompt_tokens")), int(_stat(stats, "tokens"))
    if context and tokens < max_tokens and prompt + tokens >= context:
        print(f"note: stopped at the model's context of {context} tokens ({prompt} of prompt, {tokens} generated), "
              f"before --max-tokens {max_tokens}; shorten the prompt for a longer answer", file=sys.stderr)


def _reasoning_splitter(tokenizer, messages, template_kwargs=None):
    """The splitter of the model's thinking block (None: it has none); it starts inside the block
    where the chat template opens it at the end of the prompt (DeepSeek-R1's distills)."""
    markers = thinking_markers(tokenizer)
    if markers is None:
        return None
    return make_splitter(markers, inside=chat_starts_inside(messages, tokenizer, markers,
                                                            template_kwargs=template_kwargs))


def _pair_drafter(args) -> str:
    """The drafter the pair drafts with here when --drafter is not given ("" for its draft model,
    or when the reference is no pair). Over several ranks a pair's head gives way to the n-gram
    drafter (`mlxspec.load`): "" there."""
    from ..device import backend
    from ..loading.resolve import resolve_pair

    pair = None if args.distributed else resolve_pair(args.pair or args.target or modelargs.DEFAULT_PAIR)
    return pair.drafter_on(backend()) if pair else ""


def _sampling(args) -> dict:
    """The sampling flags as `Engine.stream` takes them (`SamplingParams`' fields)."""
    return dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                typical_p=args.typical_p, top_n_sigma=args.top_n_sigma, xtc_probability=args.xtc_probability,
                xtc_threshold=args.xtc_threshold, mirostat=args.mirostat, mirostat_tau=args.mirostat_ent,
                mirostat_eta=args.mirostat_lr)


def _dry(args) -> dict:
    """DRY's flags as `Engine.stream` takes them (llama.cpp's `--dry-sequence-breaker none`: no breakers)."""
    breakers = [] if args.dry_breakers == ["none"] else args.dry_breakers
    return dict(dry_multiplier=args.dry_multiplier, dry_base=args.dry_base, dry_allowed_length=args.dry_allowed_length,
                dry_penalty_last_n=args.dry_penalty_last_n, dry_sequence_breakers=breakers)


def _check_options(args) -> None:
    """The request's settings, by the engine's own rules (it checks them again), before the load."""
    from ..dry import check_dry
    from ..prompts import check_max_tokens, check_stop
    from ..sampling import SamplingParams

    check_dry(**_dry(args))
    SamplingParams(**_sampling(args))
    check_max_tokens(args.max_tokens)
    check_stop(args.stop)
    if (args.no_chat_template or args.suffix is not None) and (args.chat_template_args or args.reasoning_effort):
        raise InvalidArgumentError("--chat-template-args and --reasoning-effort are chat template variables, and "
                                   f"{'--no-chat-template' if args.no_chat_template else '--suffix'} sends PROMPT "
                                   "without the template; send one or the other")
    if args.system is not None and args.no_chat_template:
        raise InvalidArgumentError("--system needs the chat template to place it; with --no-chat-template put the "
                                   "text in PROMPT itself")
    if args.suffix is not None and args.system is not None:
        raise InvalidArgumentError("--system needs the chat template, and --suffix sends PROMPT as raw text (the "
                                   "text before the insertion point); send one or the other")


def _response_format(args):
    """--json-schema or --regex as `response_format` (checked before the model loads; the
    engine compiles it)."""
    from pathlib import Path

    from ..grammar import check_response_format

    if args.regex is not None:
        return check_response_format({"type": "regex", "regex": args.regex}, flag="--regex")
    if args.json_schema is None:
        return None
    text = args.json_schema
    if not text.lstrip().startswith(("{", "[")) and text not in ("true", "false"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise InvalidArgumentError(f"--json-schema {text!r} is neither a JSON schema nor a file: give the schema "
                                       f"itself ('{{\"type\": \"object\"}}') or the path of a file holding one")
        text = path.read_text(encoding="utf-8")
    try:
        schema = json.loads(text)
    except ValueError as e:
        raise InvalidArgumentError(f"--json-schema is not valid JSON ({e})") from None
    return check_response_format({"type": "json_schema", "json_schema": {"schema": schema}}, flag="--json-schema")


def _prompt_text(prompt: str) -> str:
    """PROMPT, or stdin for '-'; an empty or blank one is an error (an empty message is a slip, not a question)."""
    from ..prompts import check_text

    text = sys.stdin.read() if prompt == "-" else prompt
    if not text.strip():
        if prompt == "-":
            raise InvalidArgumentError("stdin gave no text (or only blanks): pipe the message in, e.g. "
                                       "`echo 'Hello' | mlxspec generate -`, or give it as PROMPT")
        raise InvalidArgumentError("PROMPT is empty: give the message as PROMPT, or pipe it in with '-' "
                                   "(e.g. `echo 'Hello' | mlxspec generate -`)")
    return check_text(text, "PROMPT")


@contextlib.contextmanager
def _ctrl_c_sets(cancel: threading.Event):
    """While inside, the first Ctrl-C sets `cancel` (the engine ends the answer at its next round,
    finish_reason "cancelled"); a second one interrupts as usual."""
    previous = signal.getsignal(signal.SIGINT)

    def first(*_):
        cancel.set()
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stream(engine, prompt, options, splitter=None):
    """Print events' text as it comes; return the stats (the generator's return value, the
    last event's `.stats`, or `engine.last_stats`, whichever the engine provides). With a
    reasoning `splitter`, the reasoning goes to stderr (dimmed on a terminal), the answer to stdout."""
    events = engine.stream(prompt, **options)
    last, thought = None, False  # thought: reasoning printed since the last answer text
    try:
        while True:
            try:
                last = next(events)
            except StopIteration as stop:
                returned = stop.value
                break
            thought = _show(last.text, splitter, thought)
    except KeyboardInterrupt:  # Ctrl-C: what was generated, and its figures so far
        events.close()
        print(file=sys.stdout, flush=True)
        if getattr(last, "stats", None):
            print(stats_line(last.stats) + " (stopped by Ctrl-C)", file=sys.stderr, flush=True)
        raise
    if splitter is not None:
        _show(None, splitter, thought)
    for candidate in (getattr(returned, "stats", returned), getattr(last, "stats", None),
                      getattr(engine, "last_stats", None)):
        if candidate:
            return candidate
    return None


def _show(text, splitter, thought: bool = False) -> bool:
    """Print `text` (None: the end of the answer), its reasoning apart where `splitter` says;
    returns whether reasoning is the last thing printed (`thought`: it was before)."""
    if splitter is None:
        print(text, end="", flush=True)
        return False
    reasoning, answer = splitter.feed(text) if text is not None else splitter.finish()
    if reasoning:
        dim = sys.stderr.isatty()
        print(("\033[2m" if dim else "") + reasoning + ("\033[0m" if dim else ""), end="", file=sys.stderr,
              flush=True)
        thought = True
    if answer:
        if thought:  # the reasoning's last line ends before the answer
            print(file=sys.stderr, flush=True)
        print(answer, end="", flush=True)
        thought = False
    return thought


def _describe(info):
    if info is None:
        return None
    described = {"ref": info.ref, "weights_bytes": info.weights_bytes, "dtype": info.dtype, "stored": info.quantization}
    if getattr(info, "adapter", None):
        described.update(adapter=info.adapter, adapter_kind=info.adapter_kind)
    return described


def _head(engine):
    """The EAGLE head, if the engine has one ("draft" is the draft model; stats' draft figures are
    the drafter's that ran)."""
    ref = getattr(engine, "head_ref", None)
    return {"ref": ref, "weights_bytes": engine.eagle_weights_bytes,
            "note": getattr(engine, "head_note", None)} if ref else None  # note: trained under another adapter


def load_line(engine) -> str:
    """One line on what was loaded (references, precision, weights sizes) and which drafter drafts."""
    def one(info):
        adapter = f" + adapter {info.adapter} ({info.adapter_kind})" if getattr(info, "adapter", None) else ""
        sharded = getattr(info, "sharding", "none")  # its weights_bytes are then this rank's share
        share = (f" on this rank, sharded over {engine.coord.size} ranks ({sharded})"
                 if sharded not in (None, "none") else "")
        return (f"{info.ref} ({info.weights_bytes / 2**20:.0f} MiB {info.dtype}{share}, stored {info.quantization})"
                f"{adapter}")

    prefix = f"pair {engine.pair_name}: " if engine.pair_name else ""
    draft = one(engine.draft_info) if engine.draft_info else "no draft model"
    head = getattr(engine, "head_ref", None)
    note = getattr(engine, "head_note", None)
    head = f"{head} ({note})" if head and note else head
    # A pair's draft model stays loaded when its default drafter on this backend is another one.
    used = getattr(engine, "default_drafter", None)
    quant = getattr(engine, "kv_quant", None)
    kv = f"; KV cache {quant.bits}-bit from {quant.start} tokens" if quant is not None else ""
    return (f"{prefix}target {one(engine.target_info)}; {'draft ' if engine.draft_info else ''}{draft}"
            + (f"; head {head}" if head else "") + (f"; drafter {used}" if used else "") + kv)


def _stat(stats, key: str, default=0.0):
    """A figure of the stats, a mapping (engine stand-ins) or the engine's object."""
    try:
        return stats[key] or default
    except (KeyError, TypeError):
        return getattr(stats, key, default) or default


def stats_line(stats) -> str:
    """One line: the prompt (tokens, tokens/s, reused), then tokens, tokens/s, acceptance, tokens per
    target pass, peak memory."""
    def get(key, default=0.0):
        return _stat(stats, key, default)

    prompt, reused = int(get("prompt_tokens")), int(get("prompt_tokens")) - int(get("prefilled_tokens"))
    accepted = acceptance_text(int(get("accepted")), int(get("drafted")), int(get("accepted_past_end")))
    return (
        (f"prompt {plural(prompt, 'token')}"
         + (f" at {get('prompt_tokens_per_second'):.0f} tok/s" if get("prompt_timed_tokens") else "")
         + (f" ({reused} reused)" if reused > 0 else "") + "; " if prompt else "")
        + f"{plural(int(get('tokens')), 'token')} in {get('seconds'):.2f} s, {get('tokens_per_second'):.1f} tok/s, "
        f"acceptance {accepted}, "
        f"{get('tokens_per_target_pass'):.2f} tokens/target pass, "
        + (f"{plural(int(get('lookup_rounds')), 'round')} by lookup ({int(get('lookup_accepted'))}/{int(get('lookup_drafted'))}), "
           if get('lookup_rounds') else "")
        + (f"{plural(int(get('tree_rounds')), 'tree round')}, " if get('tree_rounds') else "")
        + (f"prediction {int(get('prediction_accepted'))} of {plural(predicted, 'token')} in the answer, "
           if (predicted := int(get('prediction_accepted')) + int(get('prediction_rejected'))) else "")
        + f"peak memory {get('peak_memory_bytes') / 2**20:.0f} MiB"
    )
