"""`owner/name:TAG` references: one GGUF file of a Hugging Face repo, against a stand-in hub.

The hub cannot be reached from the tests, so `huggingface_hub`'s three calls the resolver
makes are replaced by a stand-in that serves a folder of files, downloads into a cache
folder, and records what was fetched (the point of a tag is to fetch one file of many).
"""

from __future__ import annotations

import fnmatch
import shutil
from types import SimpleNamespace

import httpx
import pytest

import huggingface_hub
from huggingface_hub.errors import LocalEntryNotFoundError

from mlxspec.errors import ModelNotFoundError
from mlxspec.loading import load_model
from mlxspec.loading.resolve import resolve_model

from tiny_gguf import write_tiny_gguf

REPO = "someone/Tiny-GGUF"


class FakeHub:
    def __init__(self, tmp_path, files: dict[str, bytes | None]):
        self.remote = tmp_path / "remote"
        self.cache = tmp_path / "cache"
        self.cache.mkdir()
        for name, data in files.items():
            (self.remote / name).parent.mkdir(parents=True, exist_ok=True)
            (self.remote / name).write_bytes(data or b"GGUF")
        self.fetched: list[str] = []
        self.listed = 0

    def model_info(self, repo_id, **kwargs):
        self.listed += 1
        assert repo_id == REPO
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=str(p.relative_to(self.remote)))
                                         for p in sorted(self.remote.rglob("*")) if p.is_file()])

    def hf_hub_download(self, repo_id, filename, local_files_only=False, **kwargs):
        target = self.cache / filename
        if not target.is_file():
            if local_files_only:
                raise LocalEntryNotFoundError(f"{filename} not cached")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(self.remote / filename, target)
            self.fetched.append(filename)
        return str(target)

    def snapshot_download(self, repo_id, allow_patterns=None, local_files_only=False, **kwargs):
        assert local_files_only and repo_id == REPO
        if not any(self.cache.iterdir()):
            raise LocalEntryNotFoundError("not cached")
        assert all(fnmatch.fnmatch("x.gguf", p) for p in allow_patterns)
        return str(self.cache)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    model = tmp_path / "model.gguf"
    write_tiny_gguf(model)
    fake = FakeHub(tmp_path, {
        "tiny-q4_k_m.gguf": model.read_bytes(), "tiny-Q4_K_S.gguf": None, "tiny-Q8_0.gguf": None,
        "big/big-Q6_K-00001-of-00002.gguf": None, "big/big-Q6_K-00002-of-00002.gguf": None,
        "tiny-IQ4_XS.gguf": None, "other-IQ4_XS.gguf": None, "README.md": None,
        "UD-Q4_K_XL/tiny-UD-Q4_K_XL-00001-of-00002.gguf": None, "UD-Q4_K_XL/tiny-UD-Q4_K_XL-00002-of-00002.gguf": None,
        "tiny-UD-IQ1_S.gguf": None, "tiny-TQ1_0.gguf": None, "tiny-MXFP4.gguf": None,
    })
    for name in ("model_info", "hf_hub_download", "snapshot_download"):
        monkeypatch.setattr(huggingface_hub, name, getattr(fake, name))
    return fake


def test_a_tag_fetches_that_one_file_whatever_its_case(hub):
    found = resolve_model(f"{REPO}:Q4_K_M")
    assert found.format == "gguf" and found.source == "hub" and found.path.name == "tiny-q4_k_m.gguf"
    assert hub.fetched == ["tiny-q4_k_m.gguf"]  # not Q4_K_S, not the rest
    model, tokenizer, info = load_model(f"{REPO}:q4_k_m", dtype="float32")
    assert info.format == "gguf" and info.vocab_size == 330
    assert hub.fetched == ["tiny-q4_k_m.gguf"]  # cached: not fetched again


@pytest.mark.parametrize("tag, says", [
    # a tag is a whole quantization name: Q4_K is neither Q4_K_M nor Q4_K_S
    ("Q4_K", r"no GGUF file whose name has the quantization 'Q4_K' in the repo; there: IQ4_XS, MXFP4, Q4_K_M, "
             r"Q4_K_S, Q6_K, Q8_0, TQ1_0, UD-IQ1_S, UD-Q4_K_XL"),
    ("IQ4_XS", r"matches 2 GGUF files \(other-IQ4_XS.gguf, tiny-IQ4_XS.gguf\); name one by its file name, "
               rf"e.g. {REPO}:other-IQ4_XS.gguf"),
])
def test_a_tag_that_names_no_single_file_fetches_nothing(hub, tag, says):
    with pytest.raises(ModelNotFoundError, match=says):
        resolve_model(f"{REPO}:{tag}")
    assert hub.fetched == []


def test_a_split_gguf_fetches_every_part(hub):
    found = resolve_model(f"{REPO}:Q6_K")
    assert found.path.name == "big-Q6_K-00001-of-00002.gguf"
    assert hub.fetched == ["big/big-Q6_K-00001-of-00002.gguf", "big/big-Q6_K-00002-of-00002.gguf"]
    assert (found.path.parent / "big-Q6_K-00002-of-00002.gguf").is_file()  # beside it, as the loader looks
    (hub.remote / "big/big-Q6_K-00002-of-00002.gguf").unlink()
    with pytest.raises(ModelNotFoundError, match=r"is a GGUF split in 2 parts, but the repo has 1 of them"):
        resolve_model(f"{REPO}:q6_k")


@pytest.mark.parametrize("tag", ["UD-Q4_K_XL", "ud-q4_k_xl", "Q4_K_XL"])
def test_unsloths_dynamic_quantizations_are_named_with_or_without_their_prefix(hub, tag):
    # unsloth's model cards say `llama-cli -hf unsloth/NAME-GGUF:UD-Q4_K_XL`
    assert resolve_model(f"{REPO}:{tag}").path.name == "tiny-UD-Q4_K_XL-00001-of-00002.gguf"
    assert resolve_model(f"{REPO}:UD-IQ1_S").path.name == "tiny-UD-IQ1_S.gguf"
    assert resolve_model(f"{REPO}:tq1_0").path.name == "tiny-TQ1_0.gguf"
    assert resolve_model(f"{REPO}:mxfp4").path.name == "tiny-MXFP4.gguf"


def test_a_file_name_is_a_tag_too(hub):
    assert resolve_model(f"{REPO}:tiny-Q8_0.gguf").path.name == "tiny-Q8_0.gguf"
    assert hub.fetched == ["tiny-Q8_0.gguf"]


def test_offline_uses_the_cache_and_says_what_to_pull(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFoundError, match=rf"nothing of '{REPO}' is in the Hugging Face cache and "
                                                 rf"HF_HUB_OFFLINE is set; .*mlxspec pull {REPO}:Q4_K_M"):
        resolve_model(f"{REPO}:Q4_K_M")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    resolve_model(f"{REPO}:Q4_K_M")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    listed = hub.listed
    assert resolve_model(f"{REPO}:Q4_K_M").path.name == "tiny-q4_k_m.gguf"
    assert hub.listed == listed  # offline: the cache alone answered
    with pytest.raises(ModelNotFoundError, match=r"'Q8_0' in the Hugging Face cache; there: Q4_K_M \(with "
                                                 rf"network access, `mlxspec pull {REPO}:Q8_0` fetches it\)"):
        resolve_model(f"{REPO}:Q8_0")


def test_a_gguf_only_repo_named_bare_suggests_tags(hub, monkeypatch):
    def no_model(repo_id, allow_patterns=None, local_files_only=False, **kwargs):
        return str(hub.remote)  # what the hub gives for mlx-lm's patterns: README.md, no config.json

    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_model)
    with pytest.raises(ModelNotFoundError, match=rf"'{REPO}' holds GGUF files, not an mlx-lm model: name one "
                                                 rf"as {REPO}:TAG, e.g. {REPO}:IQ4_XS, {REPO}:MXFP4, {REPO}:Q4_K_M"):
        resolve_model(REPO)
    # asked not to download (`mlxspec models` checking its cache), the hub is never asked
    listed = hub.listed
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model(REPO, download=False)
    assert hub.listed == listed


@pytest.mark.parametrize("error", [OSError("network is unreachable"),
                                   httpx.ConnectError("[Errno -2] Name or service not known")])
def test_an_unreachable_hub_falls_back_to_the_cache(hub, monkeypatch, error):
    resolve_model(f"{REPO}:Q4_K_M")  # fetched once

    def unreachable(repo_id, **kwargs):
        raise error  # what the hub's HTTP client raises with no network (httpx's is no OSError)

    for name in ("model_info", "list_repo_files"):
        monkeypatch.setattr(huggingface_hub, name, unreachable)
    assert resolve_model(f"{REPO}:Q4_K_M").path.name == "tiny-q4_k_m.gguf"
    with pytest.raises(ModelNotFoundError, match=r"no GGUF file whose name has the quantization 'Q8_0' in the "
                                                 r"Hugging Face cache"):
        resolve_model(f"{REPO}:Q8_0")
    shutil.rmtree(hub.cache)
    hub.cache.mkdir()
    # as a bare repo id is told: not cached, and why
    with pytest.raises(ModelNotFoundError, match=rf"nothing of '{REPO}' is in the Hugging Face cache and the hub "
                                                 r"cannot be reached"):
        resolve_model(f"{REPO}:Q4_K_M")


def test_a_repo_the_hub_does_not_know_is_said(hub, monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    def unknown(repo_id, **kwargs):
        raise RepositoryNotFoundError("404 Client Error: Repository Not Found",
                                      response=httpx.Response(404, request=httpx.Request("GET", "http://hub/")))

    monkeypatch.setattr(huggingface_hub, "model_info", unknown)
    with pytest.raises(ModelNotFoundError, match=rf"cannot list the files of '{REPO}' on the Hugging Face hub: "
                                                 r"404 Client Error"):
        resolve_model(f"{REPO}:Q4_K_M")
