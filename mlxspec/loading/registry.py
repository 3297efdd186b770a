"""The curated pairs of `models.toml` (shipped inside the package as `mlxspec/models.toml`).

The repository root holds the same file for people browsing the source; a test keeps the
two identical. The package always reads its own copy, so editable and regular installs
behave alike.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass, fields
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

from ..choices import DRAFTERS, WEIGHTLESS_DRAFTERS
from ..device import BACKENDS
from ..errors import MlxSpecError
from ..paths import user_pairs_path

PACKAGED = Path(__file__).resolve().parent.parent / "models.toml"


@dataclass(frozen=True)
class Pair:
    name: str  # what users type
    target: str  # model reference of the target
    draft: str  # model reference of the draft, or "ngram" / "none"
    note: str  # one line on why this pair
    target_gb: float  # approximate weights size on disk, GB
    draft_gb: float  # approximate weights size on disk, GB (0 for weightless drafters)
    context: int  # the target's trained context, tokens
    window: int  # sliding-window span, tokens (0 = none)
    quantization: str  # storage of target / draft weights
    # optional default drafter ("ngram", "model", "eagle"), or one per backend ({cpu = "eagle",
    # metal = "ngram", cuda = "ngram"}: whichever the bench measured faster there); "" = the draft model
    drafter: str = ""
    head: str = ""  # optional EAGLE head ("builtin:<name>" or a folder) trained for the target
    adapter: str = ""  # optional fine-tuned adapter folder (mlx_lm.lora's) applied to the target
    fuse_adapter: bool = False  # fold that adapter into the target's weights at load (`--fuse-adapter`)

    @property
    def draft_is_model(self) -> bool:
        return self.draft not in WEIGHTLESS_DRAFTERS

    def drafter_on(self, backend: str) -> str:
        """The default drafter on `backend` ("cpu", "metal", "cuda"); "" = the draft model."""
        if isinstance(self.drafter, dict):
            return self.drafter.get(backend, "")
        return self.drafter

    def default_drafter(self, backend: str) -> str:
        """Who drafts on `backend` when nothing is overridden, as `mlxspec.load` decides: the
        pair's drafter there, else the draft (a weightless one itself, else the draft model)."""
        return self.drafter_on(backend) or ("model" if self.draft_is_model else self.draft)


# In a user's own file only `name` and `target` are needed: the rest describes a pair for the
# curated list (sizes, context, a note) or has a default that works for any target.
OWN_DEFAULTS = {"draft": "ngram", "note": "", "target_gb": 0.0, "draft_gb": 0.0, "context": 0, "window": 0,
                "quantization": ""}


def load_pairs(path: str | Path = PACKAGED, *, own: bool = False) -> dict[str, Pair]:
    """Parse a models.toml file into `{name: Pair}`, in file order.

    Args:
        path: the file to read. Default: the copy shipped in the package.
        own: a user's own file, where fields other than `name` and `target` may be left out
            (`OWN_DEFAULTS`: the n-gram drafter, sizes and context 0 for unknown).

    Raises:
        MlxSpecError: the file is missing, is not TOML, or an entry lacks a field, has an
            unknown field, a field of the wrong type, or a duplicate name.
    """
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise MlxSpecError(f"cannot read the pair registry {path}: {e}") from e
    except UnicodeDecodeError as e:  # saved as Latin-1 or UTF-16 by an editor
        raise MlxSpecError(f"cannot read the pair registry {path}: it is not UTF-8 text (byte {e.start}: "
                           f"{e.object[e.start:e.start + 1]!r}); save it as UTF-8, as TOML requires") from None
    known = {f.name: f.type for f in fields(Pair)}
    optional = {f.name for f in fields(Pair) if f.default is not MISSING} | (set(OWN_DEFAULTS) if own else set())
    out: dict[str, Pair] = {}
    if set(data) - {"pair"}:
        raise MlxSpecError(f"{path}: unknown top-level keys {sorted(set(data) - {'pair'})}; a pair registry holds "
                           f"only [[pair]] tables")
    entries = data.get("pair", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MlxSpecError(f"{path}: 'pair' must be written as [[pair]] tables (an array of tables), "
                           f"got {type(entries).__name__}")
    for i, entry in enumerate(entries):
        where = f"{path}: [[pair]] #{i + 1} ({entry.get('name', 'unnamed')!r})"
        missing = sorted(set(known) - set(entry) - optional)
        unknown = sorted(set(entry) - set(known))
        if missing or unknown:
            wrong = [f"missing fields {missing}"] * bool(missing) + [f"unknown fields {unknown}"] * bool(unknown)
            raise MlxSpecError(f"{where}: {', '.join(wrong)}; allowed fields are {sorted(known)}")
        for key, value in entry.items():
            if key == "drafter" and isinstance(value, dict):
                if not set(value) <= set(BACKENDS) or not all(isinstance(v, str) for v in value.values()):
                    raise MlxSpecError(f"{where}: field 'drafter' must be a string or a table of strings keyed by "
                                       f"backend ({', '.join(BACKENDS)}), got {value!r}")
                continue
            want = {"str": str, "int": int, "float": (int, float), "bool": bool}[known[key]]
            if not isinstance(value, want) or isinstance(value, bool) != (known[key] == "bool"):
                raise MlxSpecError(f"{where}: field {key!r} must be {known[key]}, got {value!r}")
        if entry["name"] in out:
            raise MlxSpecError(f"{where}: the name {entry['name']!r} appears twice")
        if not entry["name"].strip():
            raise MlxSpecError(f"{where}: the name is blank; a pair needs a name to be chosen by")
        for key in ("target", "draft", "head", "adapter"):  # a relative path means one beside this file, not the cwd
            value = entry.get(key)
            if value and (value.startswith(("./", "../")) or (path.parent / value).exists()):
                entry = {**entry, key: str((path.parent / value).resolve())}
        pair = Pair(**{**(OWN_DEFAULTS if own else {}), **entry})
        _check_drafter(pair, where)
        out[entry["name"]] = pair
    return out


def _check_drafter(pair: Pair, where: str) -> None:
    """A default drafter the pair can have: a known name, "eagle" only with a head, "model" only with a draft model."""
    named = pair.drafter.values() if isinstance(pair.drafter, dict) else [pair.drafter]
    allowed = [d for d in DRAFTERS if d != "none"]
    for d in named:
        if d and d not in allowed:
            raise MlxSpecError(f"{where}: field 'drafter' names {d!r}; allowed: {', '.join(allowed)} (or leave it out "
                               f"for the draft model)")
        if d == "eagle" and not pair.head:
            raise MlxSpecError(f"{where}: drafter 'eagle' needs a head: add head = \"builtin:<name>\" or a folder")
        if d == "model" and not pair.draft_is_model:
            raise MlxSpecError(f"{where}: drafter 'model' needs a draft model, but draft is {pair.draft!r}")


@lru_cache(maxsize=8)
def _parsed(path: Path, stamp: tuple, own: bool = False) -> dict[str, Pair]:
    return load_pairs(path, own=own)


def pairs() -> dict[str, Pair]:
    """Every pair, `{name: Pair}`: the packaged ones, then the user's own from
    `$MLXSPEC_HOME/models.toml` when that file exists (a user pair with a packaged pair's name
    replaces it). Each file is parsed again only when it changes."""
    out = dict(_parsed(PACKAGED, ()))
    mine = user_pairs_path()
    try:
        st = mine.stat()
    except OSError:
        return out
    out.update(_parsed(mine, (st.st_mtime_ns, st.st_size), own=True))
    return out


def own_pair_state(entry: dict) -> str:
    """Whether the user's models.toml may get the pair `entry` (fields of a [[pair]]): "new", or
    "same" when a pair of that name with these fields is there already (a rerun).

    Raises:
        MlxSpecError: the name is blank or a curated pair's, a pair of that name says otherwise, or
            the file cannot be read as a registry.
    """
    name, path = entry["name"], user_pairs_path()
    if not name.strip():
        raise MlxSpecError("the pair's name is blank; give the name to choose it by (mlxspec chat --pair NAME)")
    if name in _parsed(PACKAGED, ()):
        raise MlxSpecError(f"{name!r} is a curated pair's name (mlxspec models); give your pair a name of its own")
    mine = load_pairs(path, own=True) if path.exists() else {}
    if name not in mine:
        return "new"
    have = mine[name]
    if all(getattr(have, k) == v for k, v in entry.items()):
        return "same"
    raise MlxSpecError(f"{path} already has a pair {name!r} (target {have.target!r}, head {have.head!r}): give "
                       f"another name, or remove that entry first")


def add_own_pair(entry: dict) -> bool:
    """Append the pair `entry` (string fields) to the user's models.toml, made if missing, whole
    or not at all; False when it was there already (`own_pair_state`, which also says what
    refuses it)."""
    import json

    from ..files import write_atomic

    if own_pair_state(entry) == "same":
        return False
    path = user_pairs_path()
    old = path.read_text(encoding="utf-8") if path.exists() else ""
    # JSON's string escapes are TOML's basic strings' (\\, \", \uXXXX)
    table = "[[pair]]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in entry.items())
    text = old.rstrip("\n") + "\n\n" + table if old.strip() else table
    tomllib.loads(text)  # never write a file that would not parse
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    return True


def get_pair(name: str) -> Pair | None:
    """The pair called `name` (the user's own first, see `pairs`), or None when there is none."""
    return pairs().get(name)
