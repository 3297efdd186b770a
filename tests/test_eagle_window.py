"""An EAGLE head's own window (its config's `window`): the head attends to its latest entries
only, the target to everything; drafts change, the output never does."""

import json
import re
import shutil

import mlx.core as mx
import pytest

import tiny
from mlxspec import Engine
from mlxspec.cache import GrowingKVCache, WindowKVCache
from mlxspec.drafters.eagle import EagleDrafter, head_window, load_head
from mlxspec.errors import IncompatibleModelsError
from mlxspec.sequence import Sequence
from test_eagle import PROMPT, head_outputs
from test_engine import assert_same_greedy, reference

W = 16


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1, layers=1)


def windowed(head_dir, path, window):
    """A copy of the head folder whose config sets `window`."""
    shutil.copytree(head_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "window": window}))
    return path


@pytest.fixture(scope="module")
def heads(target, tmp_path_factory):
    """(random head, the same with window W, copy head with window W)."""
    base = tmp_path_factory.mktemp("w")
    rand = tiny.make_eagle_head(target, base / "rand", seed=3, draft_ids=list(range(0, tiny.VOCAB, 3)))
    copy = tiny.make_eagle_head(target, base / "copy", copy=True)
    return rand, windowed(rand, base / "rand_w", W), windowed(copy, base / "copy_w", W)


def drafter(target, head_dir, *, engine_window=None, head_cache=None):
    """As the engine builds it: the target windowed by `engine_window`, the head by its config too
    (`head_cache`: instead a window given to the head's cache alone, the config's ignored)."""
    head, ids, cfg = load_head(head_dir, target)
    seq = Sequence(target, max_kv_size=engine_window, headroom=17, keep_hidden=True)
    if head_cache is not None:
        return seq, EagleDrafter(head, ids, seq, max_kv_size=head_cache, headroom=17)
    return seq, EagleDrafter(head, ids, seq, max_kv_size=engine_window, headroom=17, window=head_window(cfg))


def long_history(n=60):
    return [3 + (7 * i + i * i) % (tiny.VOCAB - 3) for i in range(n)]


def test_the_head_attends_to_its_window_only(target, heads):
    """With window W in its config, the head drafts as one whose own cache is a window of W
    (sinks kept, as the engine's windows), over an unwindowed target, and otherwise than when it
    attends to the whole history; the target keeps its whole cache."""
    rand, rand_w, _ = heads
    history = long_history()
    outs = {}
    for name, head_dir, head_cache in (("config", rand_w, None), ("cache", rand, W), ("whole", rand, None)):
        seq, d = drafter(target, head_dir, head_cache=head_cache)
        seq.prefill(history[:-1])
        d.prefill(history)
        outs[name] = head_outputs(d, history, 4)[1]
        if name == "config":  # the target is not windowed: only the head is
            assert all(isinstance(c, GrowingKVCache) for c in seq.caches)
            assert all(isinstance(c, WindowKVCache) and c.window == W for c in d.caches)
    tol = tiny.float32_tol()
    assert mx.allclose(outs["config"], outs["cache"], atol=tol, rtol=tol).item()
    assert not mx.allclose(outs["config"], outs["whole"], atol=1e-3, rtol=1e-3).item()


@pytest.mark.parametrize("engine_window,want", [(None, W), (12, 12), (40, W)])
def test_the_narrower_window_holds(target, heads, engine_window, want):
    _, d = drafter(target, heads[1], engine_window=engine_window)
    assert d.max_kv_size == want
    assert all(c.window == want for c in d.caches)


@pytest.mark.parametrize("lookup", [True, False])
@pytest.mark.parametrize("which", [1, 2])
def test_greedy_with_a_windowed_head_matches_plain_decoding(target, heads, which, lookup):
    """Well past the head's window (and its rollbacks through the ring), the output is the target's."""
    ref = reference(target, PROMPT, 120)
    e = Engine(target, None, eagle_head=heads[which], drafter="eagle", num_draft=4, lookup=lookup)
    r = e.generate(PROMPT, max_tokens=120)
    assert_same_greedy(target, PROMPT, r.tokens, ref)
    assert r.stats.drafted > 0
    if which == 2:  # the copy head still drafts what the target says behind its window
        assert r.stats.accepted > r.stats.drafted / 2


def test_seeded_sampling_with_a_windowed_head_is_plain_decodings(target, heads):
    plain = Engine(target, None).generate(PROMPT, max_tokens=80, temperature=0.8, seed=5, speculative=False)
    e = Engine(target, None, eagle_head=heads[1], drafter="eagle", num_draft=3)
    assert e.generate(PROMPT, max_tokens=80, temperature=0.8, seed=5).tokens == plain.tokens


@pytest.mark.parametrize("prompt_cache_size", [0, 4])
def test_a_later_request_may_go_back_past_the_heads_window(target, heads, prompt_cache_size):
    """The target's cache is whole, so a later request rolls it back to any earlier prefix (a chat
    that edits an earlier turn); the head, whose window cannot roll back that far, feeds again
    from the target's features, which its window must not have let go."""
    e = Engine(target, None, eagle_head=heads[2], drafter="eagle", num_draft=4, prompt_cache_size=prompt_cache_size)
    plain = Engine(target, None)
    first = e.generate(PROMPT, max_tokens=200)
    for history in (PROMPT + first.tokens + [7, 8, 9], PROMPT + first.tokens[:50]):
        again = e.generate(history, max_tokens=60)
        assert again.tokens == plain.generate(history, max_tokens=60, speculative=False).tokens
        assert again.stats.accepted >= 0.5 * again.stats.drafted > 0  # the copy head still drafts


@pytest.mark.parametrize("window", [4, 0, -1, 2.5, "16", True])
def test_a_window_that_is_not_a_length_is_refused(target, heads, tmp_path, window):
    with pytest.raises(IncompatibleModelsError, match=re.escape(f"window {window!r}") + ".*whole number >= 5"):
        load_head(windowed(heads[0], tmp_path / "h", window), target)


def test_null_means_the_whole_history(target, heads, tmp_path):
    head, ids, cfg = load_head(windowed(heads[0], tmp_path / "h", None), target)
    assert head_window(cfg) is None


def test_a_head_that_reads_the_targets_cache_has_no_window(target, tmp_path):
    h = tiny.make_eagle_head(target, tmp_path / "ctx", context="target")
    with pytest.raises(IncompatibleModelsError, match="keeps no cache of its own"):
        load_head(windowed(h, tmp_path / "ctx_w", W), target)
