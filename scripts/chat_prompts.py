"""Chat prompts written by the target itself (self-instruct; offline, seeded; needs PyTorch).

    python scripts/chat_prompts.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --n 768 --out chat-prompts.jsonl
    python scripts/train_eagle.py ... --prompt-file chat-prompts.jsonl

Templated prompts share a few phrasings; users do not. Here the target is asked to play a
user ("Write a message that a user might send to an AI assistant, asking for advice about a
leaking faucet. Reply with the user's message only, in one to three sentences.") over intents
x topics, sampled at --temperature, and what it writes becomes a prompt: its own phrasings, so
nothing outside the target enters a head trained on them. Replies are cleaned (a message the
reply quotes is taken out of its wrapper, "Sure, here's a message: ...", and a label like
"User:" dropped), cut at the last full sentence when the length limit stopped them, and dropped
when too short, too long or repeated. A small target writes odd requests now and then (some
in the assistant's voice); that is fine for a draft head, which learns how the target answers,
not whether the request made sense. Same GGUF, seed and PyTorch version: the same file.
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlxspec.training.draft_prompts import TOPICS, chat_ids, write_jsonl  # noqa: E402

INTENTS = [
    "asking for practical advice about {t}",
    "asking for a simple explanation of {t}",
    "asking for recommendations related to {t}",
    "describing a problem they have with {t} and asking how to fix it",
    "asking for help planning something that involves {t}",
    "asking the assistant to compare two options related to {t}",
    "asking for a short poem about {t}",
    "asking for a short story about {t}",
    "asking for a list of ideas related to {t}",
    "asking a question about the history of {t}",
    "sharing a worry about {t} and asking what to do",
    "asking for step-by-step instructions related to {t}",
    "asking for a fun fact about {t} for a friend",
    "asking for a short speech or toast about {t}",
]
# Everyday situations and story seeds (none is a bench-suite prompt's subject).
EVERYDAY = [
    "a job interview", "a noisy neighbour", "learning to swim", "a birthday party", "saving money for a trip",
    "a broken bicycle", "a first marathon", "adopting a cat", "a leaking faucet", "a long flight",
    "a wedding speech", "studying for exams", "a vegetable garden", "moving to a new city", "a new puppy",
    "working from home", "a road trip", "a school science project", "a slow laptop", "buying a used car",
    "a difficult coworker", "writing a cover letter", "cooking for a large group", "a camping trip",
    "learning the guitar", "a rainy weekend", "a book club", "a family reunion", "home workouts",
    "starting a small business", "a museum visit", "a tight budget", "a picky eater", "a phone battery",
    "meal prep", "a power outage", "driving in snow", "a first apartment", "a lost wallet", "public transport",
    "a retirement party", "a charity bake sale", "a podcast", "knitting", "birdwatching", "a wedding gift",
    "a toddler's tantrums", "a job offer", "a group presentation", "an old photograph", "a city festival",
    "a haunted house", "a robot who wants to be a chef", "a lost kitten", "a magic library", "an astronaut",
    "a pirate ship", "autumn leaves", "a mountain village", "the first day of spring", "a time traveller",
    "a talking tree", "a snowy forest", "a friendly ghost", "a dog that can fly", "a bakery at dawn",
    "homework for a ten-year-old", "a tax return", "a fridge that smells", "a first date", "a garage sale",
    "learning to code", "a spreadsheet", "a passport renewal", "an allergy to cats", "a sore back",
    "a fish tank", "a piano recital", "a soccer team", "a surprise party", "a crowded inbox",
]
LABEL = re.compile(r"^\s*(user|me|message|request|question|you|human)\s*:\s*", re.I)
# "Sure, here's a message: \"...\"" / "A user might send: \"...\"": the quoted part is the message.
WRAPPED = re.compile(r"^(sure|here|the user|a user|user might|ask|example)\b.*?\"(?P<msg>[^\"]+)(\"|$)", re.I | re.S)


def meta_prompts(n: int, seed: int) -> list:
    """n (intent, topic, meta-prompt) triples, distinct while the grid lasts, then repeated (sampling differs)."""
    grid = [(i, t) for i in INTENTS for t in EVERYDAY + TOPICS]
    random.Random(seed).shuffle(grid)
    out = []
    for j in range(n):
        intent, topic = grid[j % len(grid)]
        ask = intent.format(t=topic)
        out.append((intent, topic, "Write a message that a user might send to an AI assistant, "
                                    f"{ask}. Reply with the user's message only, in one to three sentences."))
    return out


def clean(text: str, finished: bool, *, min_chars: int = 20, max_chars: int = 600):
    """The user message in a reply, or None when there is none worth keeping."""
    text = LABEL.sub("", text.strip()).strip()
    wrapped = WRAPPED.match(text)
    if wrapped:
        text = wrapped["msg"].strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    if not finished:  # stopped by the length limit: keep whole sentences only
        cut = max(text.rfind(c) for c in ".?!")
        text = text[: cut + 1] if cut >= 0 else ""
    if not (min_chars <= len(text) <= max_chars) or len(text.split()) < 4:
        return None
    return text


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", required=True, help="the target's GGUF (it writes the prompts)")
    p.add_argument("--n", type=int, default=768, help="how many meta-prompts to ask (fewer prompts survive cleaning)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.5,
                   help="sampling temperature of the written messages (0.5 kept the target in the user's voice more often than 0.8)")
    p.add_argument("--max-new", type=int, default=64, help="longest reply, in tokens")
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True, help="the JSONL file to write (train_eagle.py --prompt-file)")
    args = p.parse_args(argv)
    if args.n < 1 or args.batch < 1 or args.max_new < 8:
        p.error("--n and --batch must be at least 1 and --max-new at least 8")
    if not 0 < args.temperature <= 2:
        p.error("--temperature must be in (0, 2]: a greedy target writes the same message for the same ask")
    gguf = Path(args.gguf)
    if not gguf.is_file():
        p.error(f"--gguf {gguf}: no such file")

    import torch

    from mlxspec.training import eagle_data

    torch.set_num_threads(args.threads)
    tok, model = eagle_data.load_target(gguf)
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    metas = meta_prompts(args.n, args.seed)
    seen, out, t0 = set(), [], time.time()
    for b in range(0, len(metas), args.batch):
        chunk = metas[b:b + args.batch]
        ids = [chat_ids(tok, m[2]) for m in chunk]
        gen = torch.Generator().manual_seed(args.seed * 100003 + b)
        rows = eagle_data.generate_batch(model, ids, max_new=args.max_new, temperature=args.temperature,
                                         gen=gen, eos=eos, pad=pad)
        for (intent, topic, _), (seq, _, _), p_ids in zip(chunk, rows, ids):
            answer = seq[len(p_ids):]
            finished = len(answer) and int(answer[-1]) == eos
            text = clean(tok.decode(answer, skip_special_tokens=True), bool(finished))
            if text and text not in seen:
                seen.add(text)
                out.append({"kind": "chat-self", "prompt": text, "intent": intent,
                            "topic": topic})
        print(f"[{time.strftime('%H:%M:%S')}] {min(b + args.batch, len(metas))}/{len(metas)} asked, "
              f"{len(out)} kept ({time.time() - t0:.0f}s)", flush=True)
    if not out:
        raise SystemExit("the target wrote no usable message; try a higher --temperature or --max-new")
    dest = Path(args.out)
    write_jsonl(dest, out)
    print(f"{len(out)} of {len(metas)} messages kept -> {dest}")


if __name__ == "__main__":
    main()
