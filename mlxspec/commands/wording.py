"""The Python API's error messages in the command line's words (not a command itself).

`load` and the engine say `drafter='model'`, `head=<folder or builtin:name>` and tag their origin
(`[load] ...`), which suits a Python caller; at the command line the same rule reads better with
the flags that set those keywords (`--drafter model`, `--head <folder or builtin:name>`) and
without the tag. The API keeps its messages; `cli.main` rewords them where it prints them.
"""

from __future__ import annotations

import re
import shlex

# keywords of `load` and `Engine.generate` that a flag of the same name (with dashes) sets
FLAG_KEYWORDS = ("target", "draft", "drafter", "head", "adapter_path", "dtype", "max_kv_size", "kv_bits",
                 "kv_group_size", "quantized_kv_start", "num_draft", "tree", "lookup", "max_tokens", "temperature",
                 "top_p", "top_k", "min_p", "seed", "stop")
SWITCHES = ("fuse_adapter",)  # keywords a flag without a value sets (keyword=True reads as the flag)
_TAG = re.compile(r"^\[[a-z_]+\] ")
_SWITCH = re.compile(r"(?<![\w.-])(" + "|".join(SWITCHES) + r")=True\b")
# keyword=value with a quoted value, a <placeholder>, or a bare word
_KEYWORD = re.compile(r"(?<![\w.-])(" + "|".join(FLAG_KEYWORDS) + r")=(?:'([^']*)'|(<[^>]*>)|([\w.:/-]+))")


def for_command_line(message: str) -> str:
    """`message` without its leading origin tag, keyword=value written as the flag that sets it."""
    def flag(m: re.Match) -> str:
        quoted, placeholder, bare = m.group(2, 3, 4)
        value = shlex.quote(quoted) if quoted is not None else placeholder or bare
        return f"--{m.group(1).replace('_', '-')} {value}"

    message = _SWITCH.sub(lambda m: "--" + m.group(1).replace("_", "-"), _TAG.sub("", message))
    return _KEYWORD.sub(flag, message)
