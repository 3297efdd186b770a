"""Offline instruction prompts for self-distilling a draft model (no downloads, seeded).

Prompts come from templates x topics x styles: questions, how-tos, code requests,
summaries of passages written here, stories, math word problems and editing requests.
`make_prompts(n, seed)` is deterministic; `split(prompts, held_out)` cuts a held-out set
by prompt, so no held-out prompt (or its answer) is ever trained on. `read_prompt_file` adds
a user's own prompts (JSONL), `prompt_files` keys several by content. `eval_suite` and
`chat_ids` are what the training and evaluation scripts decode.
"""

from __future__ import annotations

import random
from typing import Dict, List, Tuple

TOPICS = [
    "photosynthesis", "black holes", "the water cycle", "volcanoes", "the French Revolution",
    "the Roman Empire", "machine learning", "climate change", "the immune system", "bees",
    "the stock market", "inflation", "renewable energy", "the printing press", "DNA",
    "earthquakes", "the moon landing", "coffee", "chess", "the Internet", "electric cars",
    "sleep", "meditation", "the ocean", "rainforests", "vaccines", "the Pyramids of Giza",
    "jazz music", "the Olympic Games", "recycling", "gravity", "the human heart",
    "ancient Greece", "bread baking", "gardening", "the solar system", "dinosaurs",
    "artificial intelligence", "the Renaissance", "friendship", "time management",
    "public speaking", "nutrition", "running", "honeybees", "glaciers", "the desert",
    "cryptography", "databases", "operating systems", "compilers", "the weather",
    "birds migrating", "the Amazon river", "Shakespeare", "the piano", "photography",
    "volunteering", "budgeting", "learning a language", "cloud computing", "robots",
]

CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "returns the n-th Fibonacci number", "counts the vowels in a string",
    "merges two sorted lists", "removes duplicates from a list while keeping order",
    "finds the largest element in a list", "checks whether a string is a palindrome",
    "converts Celsius to Fahrenheit", "reads a CSV file and prints each row",
    "sorts a list of dictionaries by a key", "computes the average of a list of numbers",
    "counts word frequencies in a text", "flattens a nested list",
    "implements binary search", "validates an email address with a regular expression",
    "computes the greatest common divisor of two numbers", "transposes a matrix",
    "returns the squares of the even numbers in a list", "implements a stack class",
    "capitalizes the first letter of every word", "sums the digits of an integer",
    "checks whether two strings are anagrams", "generates all permutations of a list",
]
LANGUAGES = ["Python", "Python", "Python", "JavaScript", "C", "Rust", "Java", "Go", "Bash"]

STYLES = ["", " Keep it short.", " Explain it simply.", " Use bullet points.",
          " Answer in one paragraph.", " Explain it to a child.", " Be concise.",
          " Give an example.", " Use three sentences."]

QUESTION = [
    "What is {t}?", "Why is {t} important?", "How does {t} work?", "Can you explain {t}?",
    "What are the main facts about {t}?", "Tell me about {t}.",
    "What are common misconceptions about {t}?", "What is the history of {t}?",
    "What are the advantages and disadvantages of {t}?", "Give me three interesting facts about {t}.",
]
HOWTO = [
    "How can I learn more about {t}?", "How do I get started with {t}?",
    "Give me step-by-step instructions for getting into {t}.", "What tips do you have about {t}?",
    "How would you teach {t} to a beginner?", "Make a study plan for learning about {t}.",
]
CODE = [
    "Write a {lang} function that {task}.", "Can you show me {lang} code that {task}?",
    "Write a short {lang} program that {task}, with comments.",
    "Implement a function in {lang} that {task} and explain how it works.",
    "How do I write code in {lang} that {task}?",
]
STORY = [
    "Write a short story about {t}.", "Write a poem about {t}.", "Write a haiku about {t}.",
    "Tell me a bedtime story that involves {t}.", "Write a funny dialogue about {t}.",
    "Write a short story about a {who} who discovers {t}.",
]
WHO = ["young girl", "old fisherman", "robot", "cat", "teacher", "scientist", "dragon", "student"]
SUMMARY = [
    "Summarize the following passage:\n\n{p}", "Give me the main idea of this text:\n\n{p}",
    "Summarize this in one sentence:\n\n{p}", "What is this paragraph about?\n\n{p}",
]
EDIT = [
    "Fix the grammar in this sentence: \"{s}\"", "Rewrite this more formally: \"{s}\"",
    "Make this sentence simpler: \"{s}\"", "Paraphrase the following: \"{s}\"",
    "Rewrite this sentence to sound more friendly: \"{s}\"", "Correct the spelling: \"{s}\"",
]
FACTS = [
    "{T} has been studied by many people for a long time.",
    "Many experts believe that {t} affects our daily lives in ways we rarely notice.",
    "Schools often teach the basics of {t} to young students.",
    "There are several different opinions about how {t} should be understood.",
    "New discoveries about {t} are published every year.",
    "Some people find {t} boring, while others find it fascinating.",
    "Understanding {t} can help people make better decisions.",
    "In recent years, interest in {t} has grown quickly around the world.",
]
BROKEN = [
    "me and him goes to the store yesterday", "their going to there house tomorow",
    "the data shows that we was right", "i has a apple and two banana",
    "she dont like to eat vegetable", "we needs more time for finish the project",
    "the meeting have been moved to friday becuase of the wheather",
    "Please send me the report as soon as posible thanks",
    "Our product is very good and many people is buying it",
    "I think that the movie was really really good and i liked it alot",
]
NAMES = ["Alice", "Ben", "Maria", "Tom", "Sara", "Leo", "Nina", "Omar"]
ITEMS = ["apples", "books", "pencils", "marbles", "cookies", "stickers", "cards", "eggs"]


def _math(rng: random.Random) -> str:
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    n, m = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    return rng.choice([
        f"{n} has {a} {item}. {m} gives {n} {b} more. How many {item} does {n} have now?",
        f"{n} had {a + b} {item} and gave away {b}. How many are left?",
        f"A box holds {c} {item}. How many {item} are in {b} boxes?",
        f"{n} buys {c} {item} for ${b} each. How much does {n} spend in total?",
        f"A train travels {a * c} km in {c} hours. What is its average speed?",
        f"What is {a} multiplied by {b}? Show your work.",
        f"If {n} reads {b} pages a day, how many days to finish a {b * c}-page book?",
        f"Solve for x: {c}x + {b} = {c * a + b}.",
        f"What is {c * 10}% of {a * 10}?",
    ])


def _passage(rng: random.Random, topic: str) -> str:
    facts = rng.sample(FACTS, 3)
    return " ".join(f.format(t=topic, T=topic[0].upper() + topic[1:]) for f in facts)


def make_prompt(rng: random.Random) -> Tuple[str, str]:
    """One (kind, user message)."""
    kind = rng.choices(["question", "howto", "code", "story", "summary", "math", "edit"],
                       weights=[4, 2, 3, 2, 1, 1.5, 1])[0]
    t = rng.choice(TOPICS)
    style = rng.choice(STYLES)
    if kind == "question":
        return kind, rng.choice(QUESTION).format(t=t) + style
    if kind == "howto":
        return kind, rng.choice(HOWTO).format(t=t) + style
    if kind == "code":
        return kind, rng.choice(CODE).format(lang=rng.choice(LANGUAGES), task=rng.choice(CODE_TASKS))
    if kind == "story":
        return kind, rng.choice(STORY).format(t=t, who=rng.choice(WHO))
    if kind == "summary":
        return kind, rng.choice(SUMMARY).format(p=_passage(rng, t))
    if kind == "math":
        return kind, _math(rng)
    return kind, rng.choice(EDIT).format(s=rng.choice(BROKEN))


def make_prompts(n: int, seed: int) -> List[Dict[str, str]]:
    """n distinct prompts [{"kind", "prompt"}], the same for the same (n, seed)."""
    rng = random.Random(seed)
    seen, out = set(), []
    while len(out) < n:
        kind, text = make_prompt(rng)
        if text not in seen:
            seen.add(text)
            out.append({"kind": kind, "prompt": text})
    return out


def split(prompts: List[Dict[str, str]], held_out: int) -> Tuple[list, list]:
    """(train, held-out): the first `held_out` prompts are held out.

    make_prompts(n) is a prefix of make_prompts(n + m), so growing the train set keeps
    the held-out set (and every earlier train prompt) unchanged.
    """
    return prompts[held_out:], prompts[:held_out]


SUITE_HELP = ("held-out: the training scripts' held-out templated prompts; bench: mlxspec bench's builtin suite "
              "(hand-written, never in the training data), kind = its category; or a JSONL prompt file "
              "(--prompt-file's formats: keep it out of the training data), kind = its \"kind\"")


def eval_suite(name: str, held_out: int = 32, seed: int = 0) -> List[Dict]:
    """"held-out": the training scripts' held-out prompts; "bench": mlxspec bench's builtin
    suite (hand-written, never in the training data), kind = its category; anything else is a
    JSONL prompt file (`read_prompt_file`), e.g. prompts of your own users held out of training."""
    if name not in ("held-out", "bench"):
        return read_prompt_file(name, "--suite")
    if name == "bench":
        from mlxspec.bench.prompts import builtin_suite

        return [{"kind": bp.category, "prompt": bp.prompt} for bp in builtin_suite()]
    return split(make_prompts(held_out, seed), held_out)[1]


def read_prompt_file(path, flag: str = "--prompt-file") -> List[Dict]:
    """Prompts from a JSONL file, one object per line, in mlx-lm's data formats: {"prompt": str}
    (a "completion" is ignored: the target writes its own answer) or {"messages": [{"role",
    "content"}, ...]} (a chat: everything up to its last user message is the prompt). An optional
    "kind" names the line's category; it defaults to "file". Blank lines are skipped. Errors
    name `flag`, the option the path came from."""
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise SystemExit(f"{flag} {path}: no such file")
    out, allowed = [], 'each line must be a JSON object with "prompt" (a string) or "messages" (a chat)'
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SystemExit(f"{flag} {path}: cannot be read as UTF-8 text ({e})")
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"{flag} {path}, line {n}: not JSON ({e.msg}); {allowed}")
        prompt = obj.get("prompt") if isinstance(obj, dict) else None
        if isinstance(obj, dict) and "messages" in obj:
            prompt = _chat_prompt(obj["messages"], f"{flag} {path}, line {n}")
        elif isinstance(prompt, list):  # a chat given as "prompt": the same rules as "messages"
            prompt = _chat_prompt(prompt, f"{flag} {path}, line {n}")
        if not (isinstance(prompt, list) or (isinstance(prompt, str) and prompt.strip())):
            raise SystemExit(f"{flag} {path}, line {n}: {allowed}")
        out.append({"kind": str(obj.get("kind", "file")), "prompt": prompt})
    if not out:
        raise SystemExit(f"{flag} {path}: no prompts in it; {allowed}")
    return out


def write_jsonl(path, rows) -> None:
    """Write rows as JSONL atomically: a stopped script never leaves half a prompt file."""
    import json
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        raise SystemExit(f"{path} is a folder: give the file to write")
    if not path.parent.is_dir():
        raise SystemExit(f"{path}: the folder {path.parent} does not exist")
    from mlxspec.files import write_atomic

    write_atomic(path, "".join(json.dumps(x) + "\n" for x in rows))


PROMPT_FILE_HELP = ('more train prompts, one JSON object per line: {"prompt": ...} or {"messages": [...]} '
                    "(mlx-lm's formats; a chat is answered after its last user message). Varied prompts "
                    "like your users' help more than more templated ones. Repeatable")


def prompt_files(paths) -> Dict[str, List[Dict]]:
    """{"file-<content digest>": prompts} per --prompt-file, all read (and checked) before any
    work starts; answer shards are named by the key, so an edited file gets new ones."""
    import hashlib
    from pathlib import Path

    read = {path: read_prompt_file(path) for path in paths}  # checked first: a missing file is said, not raised
    return {"file-" + hashlib.sha1(Path(path).read_bytes()).hexdigest()[:10]: prompts for path, prompts in read.items()}


def _chat_prompt(messages, where: str) -> list:
    """The messages up to and including the last user message."""
    roles = ("system", "user", "assistant")
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str) for m in messages):
        raise SystemExit(f'{where}: "messages" must be a list of {{"role", "content"}} with role one of {roles}')
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not users:
        raise SystemExit(f'{where}: "messages" has no user message to answer')
    return [{"role": m["role"], "content": m["content"]} for m in messages[: users[-1] + 1]]


def chat_ids(tok, prompt) -> list:
    """The ids the engine feeds the target for a chat (any tokenizer with a chat template): a
    string is one user message, a list is the messages themselves."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tok.encode(text, add_special_tokens=False)

