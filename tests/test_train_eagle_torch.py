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


def test_the_gguf_path_says_the_disk_it_needs_and_a_full_disk_ends_in_one_line_then_resumes(
        tmp_path, capsys, monkeypatch):
    import errno
    import re

    import numpy as np
    from tiny_gguf import write_tiny_gguf

    from mlxspec.training import train_common

    gguf, work = tmp_path / "tiny.gguf", tmp_path / "work"
    write_tiny_gguf(gguf, tied=False)
    argv = ["--gguf", str(gguf), "--work", str(work), "--out", str(tmp_path / "head"), "--prompts", "8",
            "--held-out", "4", "--max-new", "8", "--gen-batch", "4", "--stop-after", "generate", "--threads", "2"]
    real_savez, shards = np.savez, []

    def savez(path, **arrays):  # the second shard's write fills the disk halfway through
        shards.append(path)
        if len(shards) == 2:
            open(path, "wb").write(b"\0" * 5000)
            raise OSError(errno.ENOSPC, "No space left on device")
        real_savez(path, **arrays)
    monkeypatch.setattr(np, "savez", savez)
    with pytest.raises(SystemExit) as e:
        train_common.run_main(lambda: train_eagle.main(argv))
    said = capsys.readouterr()
    last = said.err.strip().splitlines()[-1]  # (transformers' progress bars come before it)
    assert e.value.code == 1 and last.startswith("error: the disk is full (writing ") and "Traceback" not in said.err
    assert re.search(r"still to write take up to [\d.]+ MB in \S+eagle-gen", said.out), said.out
    (kept,) = list(work.rglob("*.npz"))
    assert not [f for f in work.rglob("*tmp*")] and str(shards[1]).startswith(str(kept.parent / "."))
    monkeypatch.setattr(np, "savez", real_savez)
    train_eagle.main(argv)
    out = capsys.readouterr().out
    assert "generate 1/" not in out and "generate 2/" in out and len(list(work.rglob("*.npz"))) == 3, out
