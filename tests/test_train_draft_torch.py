"""scripts/train_draft.py (PyTorch) end to end on a tiny GGUF: the draft shares the target's
vocabulary, special tokens, context and rope (read from its GGUF, not the demo's), and drafts
for it losslessly. Skipped without torch (CI has none)."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mlxspec.training import train_draft  # noqa: E402


def test_a_draft_trained_for_another_gguf_takes_its_shape_from_it_and_drafts_for_it_losslessly(
        tmp_path, monkeypatch):
    import mlxspec
    import transformers
    from tiny_gguf import THETA, write_tiny_gguf

    gguf, out = tmp_path / "tiny.gguf", tmp_path / "draft"
    write_tiny_gguf(gguf, tied=False)
    argv = ["--gguf", str(gguf), "--work", str(tmp_path / "work"), "--out", str(out), "--prompts", "8",
            "--held-out", "4", "--max-new", "8", "--epochs", "1", "--batch", "4", "--hidden", "64",
            "--layers", "1", "--heads", "2", "--kv-heads", "1", "--intermediate", "128", "--threads", "2"]
    train_draft.main(argv)
    files = {f.name: f.read_bytes() for f in out.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files)

    def stopped(*a, **k):  # Ctrl-C in the export's last part (after the weights and config are written)
        raise KeyboardInterrupt
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", stopped)
    with pytest.raises(KeyboardInterrupt):
        train_draft.main([*argv, "--bits", "4"])  # (4 bits: other weights, were they to land)
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in out.iterdir()} == files and sorted(tmp_path.iterdir()) == sorted(
        [gguf, out, tmp_path / "work"])  # the draft as it was, no staged folder left
    cfg = json.loads((out / "config.json").read_text())
    target = mlxspec.load(str(gguf), "none")
    tok = target.tokenizer
    from mlxspec.loading.gguf_header import read_header

    assert cfg["vocab_size"] == len(read_header(gguf)[0]["tokenizer.ggml.tokens"]) != 49152
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (tok.bos_token_id, tok.eos_token_id)
    assert cfg["rope_theta"] == THETA and cfg["max_position_embeddings"] == 256 and cfg["hidden_size"] == 64
    engine = mlxspec.load(str(gguf), str(out), drafter="model", num_draft=3)
    for prompt in ("hello there", "count: one two"):
        want = target.generate(prompt, max_tokens=16, temperature=0).tokens
        assert engine.generate(prompt, max_tokens=16, temperature=0).tokens == want

