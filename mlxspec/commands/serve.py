"""`mlxspec serve`: an OpenAI-compatible HTTP server with speculative decoding.

    mlxspec serve                                    # the demo pair on http://127.0.0.1:8080/v1
    mlxspec serve --pair qwen2.5-coder-7b --api-key secret --host 0.0.0.0
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import MlxSpecError
from .argtypes import count, non_negative, positive, positive_size, size_bytes, web_origin
from .modelargs import add_distributed_arg, add_drafting_args, add_model_args, add_template_args

API_KEY_ENV = "MLXSPEC_API_KEY"


def register(subparsers) -> None:
    from ..choices import POOLINGS
    from ..serve.options import DEFAULT_MAX_BODY, DEFAULT_PROMPT_CACHE, REASONING_KEYS, ServeOptions

    d = ServeOptions()
    p = subparsers.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description=(
            "Serve one target (+ draft) over the OpenAI API (and Anthropic's, Ollama's and llama.cpp's):\n"
            "  POST /v1/chat/completions   POST /v1/completions   POST /v1/responses   GET /v1/models\n"
            "  GET|DELETE /v1/responses/{id}   GET /v1/responses/{id}/input_items\n"
            "  POST /v1/responses/input_tokens\n"
            "  POST /v1/messages[/count_tokens]   POST /v1/embeddings   POST /tokenize\n"
            "  POST /detokenize   GET /metrics   GET /health\n"
            "  POST /api/chat   POST /api/generate   POST /api/embed   GET /api/tags   POST /api/show\n"
            "  GET /api/ps   GET /api/version   (Ollama's, for editors and apps that speak it)\n"
            "  POST /completion   POST /infill   POST /embedding   GET /props   (llama.cpp's: its native\n"
            "  completions, code completion at the cursor for llama.vscode and llama.vim, embeddings,\n"
            "  and what the server is)\n\n"
            "Requests run one at a time on one engine, in arrival order; a conversation resent in full\n"
            "reuses the caches of its previous turn (usage.prompt_tokens_details.cached_tokens), also\n"
            "after other conversations in between (--prompt-cache-size). Tool calls, logprobs and\n"
            "structured output (response_format: a JSON schema every token follows), n choices, echo\n"
            "with the prompt's logprobs and fill-in-the-middle (suffix) are answered in OpenAI's\n"
            "shapes, and a thinking model's reasoning as 'reasoning' (mlx-lm's key). Predicted\n"
            "Outputs ('prediction': the file an edit rewrites) are drafted from; web pages\n"
            "of this machine may call it (CORS). Each answer carries an extra 'mlxspec' object with the\n"
            "speculation figures. A request may add\n"
            "\"speculative\": false, \"num_draft\": N, \"drafter\", \"tree\" or \"lookup\" (as the Python API's).\n"
            "Any 'model' name is answered by the loaded model."),
        epilog=("examples:\n  mlxspec serve\n"
                "  mlxspec serve --pair qwen2.5-coder-7b --drafter ngram --max-kv-size 8192\n"
                "  mlxspec serve --host 0.0.0.0 --api-key \"$(openssl rand -hex 16)\"\n\n"
                "  mlxspec serve --port 11434            # Ollama's port, where its clients look first\n\n"
                "then point any OpenAI client at http://127.0.0.1:8080/v1 (Anthropic's and Ollama's\n"
                "clients at http://127.0.0.1:8080)"),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    add_drafting_args(p, per_request=True)
    p.add_argument("--host", default=d.host, help=f"address to bind (default: {d.host}: this machine only, and then requests "
                   "addressed to another host name or sent by a web page of another origin get 403; "
                   "anything else should come with --api-key)")
    p.add_argument("--port", type=int, default=d.port, help=f"port to listen on (default: {d.port})")
    p.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV) or None,
                   help=f"require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but /health and / "
                        f"(default: ${API_KEY_ENV} if set, else no key)")
    p.add_argument("--allow-origin", type=web_origin, action="append", default=[], metavar="ORIGIN",
                   help="a web page origin (https://chat.example.com) whose browser requests may call the API and "
                        "read its answers (CORS), besides this machine's own pages; repeat for several, * for "
                        "any (the API key still applies) (default: this machine's pages only)")
    p.add_argument("--queue", type=count, default=d.queue, metavar="N",
                   help=f"requests that may wait while one generates; more get 429 with Retry-After "
                        f"(default: {d.queue})")
    p.add_argument("--prompt-cache-size", type=count, default=DEFAULT_PROMPT_CACHE, metavar="N",
                   help=f"earlier conversations whose caches are kept for when they come back, so a client "
                        f"that interleaves several (a chat and its title or autocomplete requests, an agent's "
                        f"sub-tasks) does not prefill each again at every switch; each costs the memory of its "
                        f"KV cache; 0 keeps the last request's only (default: {DEFAULT_PROMPT_CACHE})")
    p.add_argument("--prompt-cache-bytes", type=size_bytes, default=None, metavar="SIZE",
                   help="at most this much memory for the parked conversations together (512MB, 2GiB...), the "
                        "least recently used leaving first (default: no bound but --prompt-cache-size)")
    p.add_argument("--max-tokens", type=positive, default=d.max_tokens, metavar="N",
                   help=f"answer length for requests that set no max_tokens (default: {d.max_tokens})")
    p.add_argument("--temperature", type=non_negative, default=d.temperature, metavar="T",
                   help="temperature for requests that set none; 0 is greedy (default: 0; OpenAI's API "
                        "defaults to 1)")
    add_template_args(p, per_request=True)
    p.add_argument("--reasoning-key", choices=REASONING_KEYS, default=d.reasoning_key,
                   help="where a thinking model's reasoning (between <think> and </think>) goes in chat answers: "
                        "'reasoning' (mlx-lm's and vLLM's key), 'reasoning_content' (DeepSeek's API's and "
                        "llama.cpp's, which many clients read), or 'none' (left in content, markers and all) "
                        f"(default: {d.reasoning_key})")
    p.add_argument("--responses-dir", metavar="DIR", default=None,
                   help="also write the Responses API's stored responses (store: true, OpenAI's default) to DIR, "
                        "one JSON file each, so previous_response_id and GET /v1/responses/{id} still work after "
                        "a restart; the conversations are kept there in plain text until DELETE "
                        "/v1/responses/{id} or the last 256 push them out (default: in memory only)")
    p.add_argument("--max-body-size", type=positive_size, default=DEFAULT_MAX_BODY, metavar="SIZE",
                   help=f"larger request bodies get 413 (16MB, 64MiB...; default: {DEFAULT_MAX_BODY}, "
                        f"{DEFAULT_MAX_BODY >> 20} MiB)")
    p.add_argument("--client-timeout", type=non_negative, default=d.client_timeout, metavar="S",
                   help=f"seconds a client may take to send a request's head, and between two pieces of its "
                        f"body, before it is disconnected (a stalled body gets 408), so stalled connections "
                        f"cannot pile up; answers are not bounded; 0 waits forever (default: {d.client_timeout:g})")
    p.add_argument("--shutdown-grace", type=non_negative, default=d.shutdown_grace, metavar="S",
                   help=f"after SIGINT/SIGTERM, seconds a running request may take to finish before it is "
                        f"cancelled (default: {d.shutdown_grace:g})")
    p.add_argument("--pooling", choices=POOLINGS, default=d.pooling,
                   help="how embeddings (/v1/embeddings, /api/embed, /embedding) pool the model's final hidden "
                        "states: 'mean' over every token (llama.cpp's for generative models) or 'last', the last "
                        "token's (what decoder-based embedding models such as Qwen3-Embedding are trained for) "
                        f"(default: {d.pooling})")
    add_distributed_arg(p)
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=d.log_level,
                   help=f"server log detail (default: {d.log_level})")
    p.set_defaults(func=run, _parser=p)


def run(args) -> int:
    import logging

    from ..distributed import is_distributed
    from ..serve import ServeOptions, serve
    from . import modelargs

    if not 0 <= args.port <= 65535:
        args._parser.error(f"--port must be in 0..65535, got {args.port}")
    key = args.api_key
    if key is not None and not (key and key.isascii() and key.isprintable() and key == key.strip()):
        # An HTTP header carries ASCII: a client could never send another key.
        args._parser.error(f"--api-key (or ${API_KEY_ENV}) must be printable ASCII without surrounding "
                           f"spaces, e.g. from `openssl rand -hex 16`")
    if args.responses_dir is not None:  # said before the model loads, not after
        folder = Path(args.responses_dir).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            args._parser.error(f"--responses-dir {args.responses_dir}: cannot make that folder ({e.strerror})")
        if not os.access(folder, os.W_OK | os.X_OK):
            args._parser.error(f"--responses-dir {args.responses_dir}: that folder is not writable")
        args.responses_dir = str(folder)
    if not args.distributed:  # (with several ranks only rank 0 listens; uvicorn says it there)
        from ..serve.server import check_address

        check_address(args.host, args.port)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:     %(message)s")
    for note in modelargs.drafting_notes(args):
        logging.warning(note)
    engine = modelargs.load_engine(args, prompt_cache_size=args.prompt_cache_size,
                                   prompt_cache_bytes=args.prompt_cache_bytes, **modelargs.drafting_options(args))
    if is_distributed(engine) and not engine.coord.is_main:
        # Other ranks serve nothing: they warm up in step with rank 0, then run its requests.
        from ..serve.queue import warmup_temperatures

        import signal

        # A terminal's Ctrl-C reaches every rank: rank 0 shuts down (its grace period for the running
        # request, then `release`), and the others must keep following it until then.
        before = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            engine.warmup(temperatures=warmup_temperatures())
            engine.follow()
        finally:
            signal.signal(signal.SIGINT, before)
        return 0
    from .generate import load_line

    logging.getLogger("mlxspec.serve").info("%s", load_line(engine))  # what serves, before warm-up
    from ..prompts import unread_template_note

    if unread := unread_template_note(getattr(engine, "tokenizer", None), modelargs.template_options(args) or {}):
        logging.warning("%s", unread)
    options = ServeOptions(host=args.host, port=args.port, api_key=args.api_key, queue=args.queue,
                           max_tokens=args.max_tokens, temperature=args.temperature,
                           max_body_size=args.max_body_size, shutdown_grace=args.shutdown_grace,
                           log_level=args.log_level, allow_origins=tuple(args.allow_origin),
                           client_timeout=args.client_timeout, chat_template_args=modelargs.template_options(args),
                           reasoning_key=args.reasoning_key, responses_dir=args.responses_dir,
                           pooling=args.pooling)
    try:
        return serve(engine, options)
    finally:
        if is_distributed(engine) and not getattr(engine.coord, "broken", False):
            try:
                engine.release()  # the other ranks' follow() ends
            except MlxSpecError as e:  # they are gone already: nothing left to release
                logging.getLogger("mlxspec.serve").warning("%s", e)
