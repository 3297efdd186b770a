"""scripts/train_eagle.py's --gguf path (PyTorch) end to end on a tiny GGUF: it trains a head that
loads, and says where it started, as the MLX path does. Skipped without torch (CI has none)."""

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from mlxspec.training import train_eagle


def test_the_gguf_path_records_the_held_out_figures_before_training(tmp_path, capsys):
    from tiny_gguf import write_tiny_gguf

    from mlxspec.drafters.eagle_files import head_config

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, tied=False)
    train_eagle.main(["--gguf", str(gguf), "--work", str(tmp_path / "work"), "--out", str(tmp_path / "head"),
                      "--prompts", "8", "--held-out", "4", "--max-new", "8", "--epochs", "2", "--batch", "4",
                      "--draft-vocab", "32", "--threads", "2"])
    said = capsys.readouterr()
    log = said.out + said.err
    assert "held-out before training: loss " in log
    assert log.index("held-out before training") < log.index("held-out after step 4")
    assert head_config(tmp_path / "head")["training"]["script"].startswith("scripts/train_eagle.py")
    (final,) = (tmp_path / "work").glob("head_final-*.pt")
    import torch

    history = torch.load(final, weights_only=False)["history"]
    assert [h["step"] for h in history] == [0, 4]
    card = (tmp_path / "head" / "README.md").read_text()
    for h in history:  # the card's rows start from the untrained head, as the MLX path's do
        assert f"| {h['step']:,} | {h['held_loss']:.4f} |" in card
