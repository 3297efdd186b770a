"""Slash commands: parse a line, change the settings, or say what is wrong in plain words."""

from __future__ import annotations

import json
from argparse import ArgumentTypeError
from dataclasses import asdict, dataclass, replace
from typing import Optional, Sequence

from mlxspec.commands.argtypes import non_negative, num_draft, on_off, positive, template_args, tree
from mlxspec.reasoning import EFFORTS

HELP = """\
/temp T          sampling temperature (0 = greedy, the default)
/draft auto|N    draft length: auto (cost model) or a fixed N in 0..32
/drafter NAME    who drafts on the speculative side: ngram, model or eagle
/tree auto|off|N draft trees: auto (cost model), off (chains only) or at most N drafts a round
/lookup on|off   a model drafter hands rounds where the text repeats to prompt lookup (on)
/maxtokens N     answer length limit
/system TEXT     system prompt for the next turns (/system alone clears it)
/template JSON   chat template variables, e.g. {"enable_thinking": false} (/template alone clears them)
/effort LEVEL    reasoning effort (gpt-oss: low, medium, high), the template variable reasoning_effort
                 (/effort alone clears it; /template keeps it unless its JSON sets it)
/save PATH       write the conversation and its stats to PATH.json and PATH.md
/load PATH       go on with a conversation /save wrote (PATH.json), in place of this one
/retry           race the last turn again with the settings now, in place of its answers
                 (/drafter model then /retry: the same message, another drafter)
/undo            take the last turn back: its message returns to the box, to edit and send
/copy            the last answer to the clipboard (or select text with the mouse, then Ctrl-C)
/stats           the race over the whole conversation: rates, speedups, identical outputs
/clear           forget the conversation (also Ctrl-L)
/help            this list
Keys: Enter send · Up/Down earlier messages · PgUp/PgDn scroll the chat · Esc or Ctrl-C stop
      Ctrl-C copies text selected with the mouse · Ctrl-T token colours · Ctrl-L clear · Ctrl-Q quit
      (Ctrl-L and Ctrl-Q ask for a second press while turns are not saved)"""


class CommandError(ValueError):
    """A slash command with a bad name or argument; the message is shown in the chat."""


@dataclass(frozen=True)
class Settings:
    temperature: float = 0.0
    max_tokens: int = 256
    num_draft: Optional[int] = None  # None: auto (the engine's cost model)
    drafter: Optional[str] = None  # None: the engine's default
    tree: Optional[object] = None  # None: the engine's ("auto"); "off" or a cap on a round's drafts
    lookup: Optional[bool] = None  # None: the engine's (on)
    system: str = ""
    template_kwargs: Optional[dict] = None  # chat template variables (--chat-template-args, --reasoning-effort)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["num_draft"] = "auto" if self.num_draft is None else self.num_draft
        return d


@dataclass(frozen=True)
class Outcome:
    settings: Settings
    reply: str  # shown in the chat
    action: Optional[str] = None  # "save" | "load" | "clear" | "retry" | "undo" | "copy" | "stats" | None
    argument: str = ""


def run_command(line: str, settings: Settings, *, drafters: Sequence[str]) -> Outcome:
    """Apply one slash command. `drafters` are the drafter names the speculative engine has."""
    name, _, arg = line.strip().partition(" ")
    name, arg = name.lower(), arg.strip()
    if name in ("/help", "/clear", "/retry", "/undo", "/copy", "/stats") and arg:
        raise CommandError(f"{name} takes no argument, got {arg!r}")
    if name == "/help":
        return Outcome(settings, HELP)
    if name == "/temp":
        t = _parsed(name, arg, non_negative)
        return Outcome(replace(settings, temperature=t), f"temperature set to {t:g}" + (" (greedy)" if t == 0 else ""))
    if name == "/maxtokens":
        n = _parsed(name, arg, positive)
        return Outcome(replace(settings, max_tokens=n), f"answers limited to {n} tokens")
    if name == "/draft":
        n = _parsed(name, arg, num_draft)
        return Outcome(replace(settings, num_draft=n),
                       "draft length: auto (cost model)" if n is None else f"draft length fixed at {n}")
    if name == "/drafter":
        arg = arg.lower()
        allowed = [d for d in ("ngram", "model", "eagle") if d in drafters]
        if arg not in ("ngram", "model", "eagle"):
            got = f", got {arg!r}" if arg else f" (drafting now: {settings.drafter or 'the pair default'})"
            raise CommandError(f"/drafter needs one of {', '.join(allowed)}{got}")
        if arg not in drafters:
            # Not loaded is not the same as the pair having none: `--drafter ngram` loads neither.
            missing = "no EAGLE head (--head)" if arg == "eagle" else "no draft model (--draft)"
            raise CommandError(f"/drafter {arg}: this chat loaded {missing}; available: {', '.join(allowed)} "
                               f"(a pair's head and draft model are loaded unless the chat starts with --drafter ngram, "
                               f"--drafter none or --draft ngram/none)")
        return Outcome(replace(settings, drafter=arg), f"drafter set to {arg}")
    if name == "/tree":
        t = _parsed(name, arg, tree)
        said = {"auto": "draft trees: auto (cost model)", "off": "draft trees: off (chains only)"}
        return Outcome(replace(settings, tree=t), said.get(t) or f"at most {t} drafted tokens a round, tree or chain")
    if name == "/lookup":
        on = _parsed(name, arg, on_off) == "on"
        return Outcome(replace(settings, lookup=on), "lookup rounds " + ("on" if on else "off (the model drafts alone)"))
    if name == "/system":
        return Outcome(replace(settings, system=arg), f"system prompt set to {arg!r}" if arg else "system prompt cleared")
    effort = (settings.template_kwargs or {}).get("reasoning_effort")
    if name == "/template":
        if not arg:
            return Outcome(replace(settings, template_kwargs=None), "chat template variables cleared"
                           + (f" (the reasoning effort {effort} too)" if effort else ""))
        variables = _parsed(name, arg, template_args, lower=False)
        kept = effort is not None and "reasoning_effort" not in variables
        if kept:  # /effort set it apart from the other variables: it stays until /effort changes it
            variables = dict(variables, reasoning_effort=effort)
        return Outcome(replace(settings, template_kwargs=variables or None),
                       f"chat template variables set to {json.dumps(variables)}"
                       + (f" (reasoning effort {effort} kept; /effort alone clears it)" if kept else ""))
    if name == "/effort":
        if not arg:
            if effort is None:
                return Outcome(settings, f"no reasoning effort is set (the template's default); /effort "
                                         f"{'|'.join(EFFORTS)} sets one")
            variables = {k: v for k, v in (settings.template_kwargs or {}).items() if k != "reasoning_effort"}
            return Outcome(replace(settings, template_kwargs=variables or None),
                           "reasoning effort cleared (the template's default)")
        if arg.lower() not in EFFORTS:
            raise CommandError(f"/effort needs one of {', '.join(EFFORTS)} (or nothing, to clear it), got {arg!r}")
        variables = dict(settings.template_kwargs or {}, reasoning_effort=arg.lower())
        return Outcome(replace(settings, template_kwargs=variables), f"reasoning effort set to {arg.lower()}")
    if name == "/save":
        if not arg:
            raise CommandError("/save needs a path, e.g. /save chat (writes chat.json and chat.md)")
        return Outcome(settings, "", action="save", argument=arg)
    if name == "/load":
        if not arg:
            raise CommandError("/load needs the path /save was given, e.g. /load chat (reads chat.json)")
        return Outcome(settings, "", action="load", argument=arg)
    if name == "/clear":
        return Outcome(settings, "conversation cleared", action="clear")
    if name in ("/retry", "/undo", "/copy", "/stats"):  # the app says what it did: it knows the turns
        return Outcome(settings, "", action=name[1:])
    raise CommandError(f"unknown command {name!r}; type /help for the list")


def _parsed(name: str, arg: str, parse, lower: bool = True):
    """`arg` read by the command line's own parser for the same option (`mlxspec chat --tree` ...)."""
    try:
        return parse(arg.lower() if lower else arg)
    except ArgumentTypeError as e:
        raise CommandError(f"{name}: {e}") from None

