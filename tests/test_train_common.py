"""mlxspec/training/train_common.py: what the training scripts say while their answer stage runs,
and how they read their work files."""

from __future__ import annotations


from mlxspec.training import train_common


def test_each_batch_line_counts_its_own_tokens_then_the_run_s_and_the_time_still_to_go(capsys):
    now = [1000.0]
    clock = train_common.AnswerClock(5, 3, clock=lambda: now[0])  # 5 batches, 2 already cached
    for n, at, tokens in ((2, 1060.0, 100), (3, 1300.0, 500), (4, 1330.0, 50)):
        now[0] = at
        clock.done(n, f"train-{n}", tokens)
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines()]
    assert lines == [
        "generate 3/5 train-2: 100 answer tokens; 100 in 60s so far (1.7 tok/s); 2 to go, about 2 min at this pace",
        "generate 4/5 train-3: 500 answer tokens; 600 in 300s so far (2.0 tok/s); 1 to go, about 2 min at this pace",
        "generate 5/5 train-4: 50 answer tokens; 650 in 330s so far (2.0 tok/s)",
    ]


def test_a_short_wait_is_not_called_zero_minutes(capsys):
    now = [0.0]
    clock = train_common.AnswerClock(3, 3, clock=lambda: now[0])
    now[0] = 10.0
    clock.done(0, "held_out-000", 40)
    assert capsys.readouterr().out.rstrip().endswith("; 2 to go, under a minute at this pace")


def test_a_shards_features_are_memory_maps_of_it_that_read_back_what_was_saved(tmp_path):
    import numpy as np

    from mlxspec.training.eagle_data import load_features, save_shard

    rng = np.random.default_rng(0)
    shards = []
    for name, n in (("train-000", 3), ("held_out-000", 2)):
        rows = [(rng.integers(0, 50, t).astype(np.int32), rng.standard_normal((t - 1, 8)).astype(np.float16),
                 rng.standard_normal((t - 1, 16)).astype(np.float16)) for t in rng.integers(5, 12, n)]
        path = tmp_path / f"{name}.npz"
        save_shard(path, rows, [r[0][:2] for r in rows], 0.0, layers=(1, 2))
        shards.append((path, rows))
    train, held = load_features([p for p, _ in shards], layers=(1, 2))
    for got, (_, rows) in zip((train, held), shards):
        assert len(got) == len(rows)
        for (ids, f, p, m), (want_ids, want_f, want_m) in zip(got, rows):
            assert ids.tolist() == want_ids[:-1].tolist() and p == 2
            assert isinstance(f.base, np.memmap) or isinstance(f, np.memmap)
            assert f.dtype == np.float16 and np.array_equal(f, want_f)
            assert isinstance(m, np.memmap) and np.array_equal(m, want_m)


def test_a_member_that_cannot_be_mapped_is_read_whole_or_said_damaged(tmp_path):
    import numpy as np
    import pytest

    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    np.savez_compressed(tmp_path / "z.npz", feats=a)
    got, = train_common.read_arrays(tmp_path / "z.npz", "feats", mapped=True)
    assert not isinstance(got, np.memmap) and np.array_equal(got, a)

    np.savez(tmp_path / "s.npz", feats=a, empty=np.zeros((0, 4), np.float16))
    got, empty = train_common.read_arrays(tmp_path / "s.npz", "feats", "empty", mapped=True)
    assert isinstance(got, np.memmap) and np.array_equal(got, a) and empty.shape == (0, 4)

    data = bytearray((tmp_path / "s.npz").read_bytes())
    i = data.index(b"\x93NUMPY")
    data[i:i + 128] = data[i:i + 128].replace(b"(3, 4)", b"(9, 4)")  # more rows than the member holds
    assert b"(9, 4)" in data
    (tmp_path / "bad.npz").write_bytes(bytes(data))
    with pytest.raises(SystemExit, match="bad.npz.*damaged"):
        train_common.read_arrays(tmp_path / "bad.npz", "feats", mapped=True)
    with pytest.raises(SystemExit, match="damaged"):
        train_common.read_arrays(tmp_path / "s.npz", "ids", mapped=True)  # not in it


FEW_FILES = """
import resource, sys
from pathlib import Path
import numpy as np
from mlxspec.training import train_common
from mlxspec.training.eagle_data import load_features, save_shard

resource.setrlimit(resource.RLIMIT_NOFILE, ({soft}, {hard}))
rng = np.random.default_rng(0)
shards, want = [], []
for s in range(40):
    rows = [(np.arange(6, dtype=np.int32) + s, rng.standard_normal((5, 4)).astype(np.float16),
             rng.standard_normal((5, 8)).astype(np.float16))]
    shards.append(Path(sys.argv[1]) / f"train-{{s:03d}}.npz")
    save_shard(shards[-1], rows, [rows[0][0][:2]], 0.0, layers=(1, 2))
    want.append(rows[0])
train, _ = load_features(shards, layers=(1, 2))
assert all(np.array_equal(f, w[1]) and np.array_equal(m, w[2]) for (_, f, _, m), w in zip(train, want))
print(sum(isinstance(f.base, np.memmap) for _, f, _, _ in train), sum(isinstance(m, np.memmap) for *_, m in train),
      resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _few_files(tmp_path, soft, hard):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", FEW_FILES.format(soft=soft, hard=hard), str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [int(x) for x in out.stdout.split()]


def test_memory_maps_keep_to_a_hard_limit_on_open_files_and_read_the_other_shards_whole(tmp_path):
    # each map holds a file open: 150 files, 128 kept for the process, room for 11 shards' 2 maps;
    # all 40 shards still read back what was saved
    assert _few_files(tmp_path, 150, 150) == [11, 11, 150]


def test_the_soft_limit_on_open_files_is_raised_for_the_maps_where_the_hard_limit_allows(tmp_path):
    assert _few_files(tmp_path, 150, 1000) == [40, 40, 80 + 128]
