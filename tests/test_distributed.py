"""A target sharded over two local ranks (`mlx.launch --backend ring -n 2`), in CI.

`dist_worker.py` runs on each rank; here we launch it (bounded by a timeout) and compare
what the ranks saw: greedy output equal to the unsharded target with the n-gram and the
model drafter under automatic k while rank 1 is deliberately slower, identical decisions
(rounds, drafted, accepted, draft lengths) on every rank, identical seeded samples, an
early close on rank 0 only, and errors (not hangs) for differing weights, diverging
drafts, a dead rank and a hung rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import tiny

WORKER = Path(__file__).resolve().parent / "dist_worker.py"
LAUNCH_TIMEOUT = 240  # seconds; a hang must fail the test, not stall CI
WATCHDOG_SECONDS = 4


def _launcher():
    exe = Path(sys.executable).parent / "mlx.launch"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("mlx.launch")
    return [found] if found else None


def _launch(out_dir: Path, scenario: str, *, env=None):
    launcher = _launcher()
    if launcher is None:
        pytest.skip("mlx.launch is not installed")
    cmd = [*launcher, "--backend", "ring", "-n", "2", "--", sys.executable, str(WORKER), str(out_dir), scenario]
    t = time.perf_counter()
    # TMPDIR: mlx.launch leaves a pid file and a host file per rank in it (its mktemp), so here they
    # stay in this test's folder rather than pile up in /tmp
    # A session of its own: on a timeout the launcher and every rank go (killing the launcher
    # alone left a hung rank spinning on after the test, slowing every test that came next)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(out_dir), **(env or {})})
    try:
        out, err = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the ranks did not end within {LAUNCH_TIMEOUT} s:\n{out[-2000:]}\n{_errors(err)}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), time.perf_counter() - t


def _errors(stderr: str, tail: int = 3000) -> str:
    """The ranks' stderr from its first traceback on (the other rank's later output must not cut
    the one that died), else its tail."""
    i = stderr.find("Traceback")
    return stderr[i:] if i >= 0 else stderr[-tail:]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    proc, _ = _launch(out, "main")
    files = [out / f"rank{r}.json" for r in (0, 1)]
    if not all(f.exists() for f in files):
        pytest.fail(f"a rank wrote no results:\n{proc.stdout[-3000:]}\n{_errors(proc.stderr)}")
    return [json.loads(f.read_text()) for f in files]


def test_two_ranks_shard_the_target(ranks):
    assert [r["rank"] for r in ranks] == [0, 1]
    assert all(r["size"] == 2 and r["sharding"] == "tensor" for r in ranks)


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_greedy_equals_unsharded_with_identical_decisions(ranks, drafter):
    for key in (f"greedy_{drafter}", f"greedy_{drafter}_k3"):
        runs = [r[key] for r in ranks]
        for r, run in zip(ranks, runs):
            assert run["tokens"] == r["reference"], key
        # Rank 1 is slower, so its own cost model would choose other lengths: the decisions are rank 0's.
        assert runs[0] == runs[1], key
    # Speculation actually ran (at a fixed k: the automatic one may decline on a loaded machine).
    assert ranks[0][f"greedy_{drafter}_k3"]["drafted"] > 0


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_seeded_sampling_is_identical_on_every_rank(ranks, drafter):
    a, b = (r[f"sampled_{drafter}"] for r in ranks)
    assert a == b
    assert len(set(a["tokens"])) > 1


def test_typical_p_and_xtc_alike_on_every_rank(ranks):
    a, b = (r["filtered"] for r in ranks)
    assert a == b and a["tokens"] == ranks[0]["filtered_plain"]  # the sharded target's own plain sample
    assert a["tokens"] != ranks[0]["sampled_model"]["tokens"]  # the filters changed it


def test_a_grammar_is_followed_alike_on_every_rank(ranks):
    a, b = (r["constrained"] for r in ranks)
    assert a == b and a["tokens"] == ranks[0]["constrained_reference"] and a["drafted"] > 0
    assert a["tokens"] != ranks[0]["reference"][:len(a["tokens"])]  # the grammar changed the text


def test_a_ban_on_all_the_grammar_allows_next_ends_every_rank_after_the_tokens_before_it(ranks):
    for case, before in enumerate(["a", "ab"]):
        want = ranks[0][f"conflict{case}_reference"]
        assert want["tokens"] == [ord(ch) + 3 for ch in before]
        assert want["error"].startswith("nothing can be written: logit_bias bans")
        got = [r[f"conflict{case}_{name}"] for r in ranks for name in ("ngram", "model")]
        assert all(g == want for g in got), (case, got)
    # and the next request, on the caches the error left, is the unsharded target's again
    assert all(r["after_conflict"]["tokens"] == ranks[0]["reference"] for r in ranks)


def test_logit_bias_and_penalties_alike_on_every_rank(ranks):  # (DRY among them)
    a, b = (r["shaped"] for r in ranks)
    assert a == b and a["tokens"] == ranks[0]["shaped_reference"] and a["tokens"] != ranks[0]["reference"]


def test_prompt_logprobs_alike_on_every_rank(ranks):
    a, b = (r["prompt_logprobs"] for r in ranks)
    want = ranks[0]["prompt_logprobs_reference"]
    assert a["tokens"] == b["tokens"] and len(a["scored"]) == len(want) > 10
    tol = tiny.float32_tol() * 10  # sharded matmuls sum in another order
    for got in (a["scored"], b["scored"]):
        assert [t for t, _, _ in got] == [t for t, _, _ in want] and got[0][1] is None
        assert all(abs(g[1] - w[1]) <= tol and [t for t, _ in g[2]] == [t for t, _ in w[2]]
                   for g, w in zip(got[1:], want[1:]))


def test_close_on_rank_zero_ends_every_rank_and_keeps_caches_aligned(ranks):
    # Rank 1 reads on to the end of the pass it is in (then learns of the close): never fewer tokens.
    assert ranks[0]["closed_after"] <= ranks[1]["closed_after"]
    # The same committed tokens in every rank's caches (a rank that rolled a pass back twice
    # would prefill a longer prompt next time: collectives of other shapes, a divergence).
    held = [r["cached_after_close"] for r in ranks]
    assert held[0] == held[1]
    assert held[0]["offsets"] == [len(held[0]["tokens"])] * len(held[0]["offsets"])
    for r in ranks:
        assert r["after_close"]["tokens"] == r["after_close_reference"]
    assert ranks[0]["after_close"] == ranks[1]["after_close"]
    assert ranks[0]["decisions"] == ranks[1]["decisions"]


def test_a_cancel_on_a_rank_other_than_zero_is_rank_zero_s_to_act_on(ranks):
    for r in ranks:
        assert r["cancelled_elsewhere"]["tokens"] == r["cancelled_elsewhere_reference"]
    assert ranks[0]["cancelled_elsewhere"] == ranks[1]["cancelled_elsewhere"]


def test_embeddings_run_on_every_rank_on_rank_zero_s_inputs_and_are_followed(ranks):
    tol = tiny.float32_tol() * 10  # sharded matmuls sum in another order
    for r in ranks:
        got, want = np.array(r["embedded"]["vectors"]), np.array(r["embedded_reference"])
        assert got.shape == want.shape == (3, 64) and r["embedded"]["tokens"][2] > 20
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    zero, one = ranks
    np.testing.assert_allclose(zero["followed_embedding"], zero["followed_embedding_reference"], rtol=tol, atol=tol)
    assert zero["followed_greedy"]["tokens"] == zero["reference"]
    assert one["followed"] == 2  # the embedding and the generation, then released


def test_an_adapter_is_fused_before_the_target_is_sharded(ranks):
    for r in ranks:
        fused = r["adapter"]
        assert fused["kind"] == "LoRA rank 4 on 2 layers, fused" and fused["sharding"] != "none"
        assert fused["greedy"]["tokens"] == r["adapter_reference"] != r["adapter_base"]  # the adapter's own text
        assert fused["greedy"]["drafted"] > 0
        assert "cannot be applied unfused to a target sharded over 2 ranks" in r["adapter_unfused"]
    assert ranks[0]["adapter"] == ranks[1]["adapter"]  # the same decisions on both ranks


def test_differing_weights_and_diverging_drafts_raise_on_every_rank(ranks):
    for r in ranks:
        assert "target weights differ" in r["agree_differing"]
        assert "the ranks' --dtype differ" in r["load_differing"], r["load_differing"]  # the files are the same
        assert "the ranks' --drafter differ" in r["drafter_differing"], r["drafter_differing"]
        assert "diverged" in r["diverged"]


# mlx.launch stops the other ranks once one exits, sometimes before rank 0 has printed its own
# error: the ring's report of the lost peer (which rank 0 turns into that error), or the
# launcher's report that it ended rank 0 (no hang, no result written), also counts.
@pytest.mark.parametrize("scenario, messages", [("die", ("lost the other ranks", "connection to a peer was lost",
                                                         "Node with rank 0 exited with code")),
                                                ("hang", ("waited more than",))])
def test_a_dead_or_hung_rank_ends_rank_zero_with_an_error(tmp_path, scenario, messages):
    proc, seconds = _launch(tmp_path, scenario, env={"MLXSPEC_DISTRIBUTED_TIMEOUT": str(WATCHDOG_SECONDS)})
    assert any(m in proc.stderr for m in messages), _errors(proc.stderr)
    assert not (tmp_path / "rank0.json").exists()
    assert seconds < LAUNCH_TIMEOUT


def test_a_rank_whose_peers_never_join_ends_after_the_timeout(tmp_path):
    """A host not started (or started without --distributed) must not leave the others waiting
    forever to form the group: MLX holds the GIL there, so the watchdog is faulthandler's."""
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    hosts = tmp_path / "hosts.json"
    hosts.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in ports]))
    code = "from mlxspec.distributed import init_group; init_group('ring')"
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=LAUNCH_TIMEOUT,
                          env={**os.environ, "MLX_RANK": "0", "MLX_HOSTFILE": str(hosts),
                               "MLXSPEC_DISTRIBUTED_TIMEOUT": "2"})
    assert proc.returncode == 1 and "Timeout (0:00:02)!" in proc.stderr and "init_group" in proc.stderr, proc.stderr
    assert time.perf_counter() - t < 30
