"""Property tests of the rollback caches against a plain Python model of the token history.

Each written key/value encodes (token, position), so a stale or misplaced entry shows up.
After every write, the keys each query can see (cache output filtered by its own mask)
must be exactly those the window rule gives: positions 0..keep-1 plus the
`window - keep` most recent up to the query (every position for the growing cache).
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from mlxspec.cache import GrowingKVCache, WindowKVCache, make_cache
from mlxspec.errors import CacheRollbackError, IncompatibleModelsError, InvalidArgumentError

import tiny


def encode(tok, pos):
    return float(tok * 10_000 + pos)


def visible_sets(cache, start, tokens, window_size=None):
    """Write tokens at start.. and return, per query, the set of encoded keys it sees (through a
    layer's own attention window `window_size`, if it passes one)."""
    S = len(tokens)
    mask = cache.make_mask(S, return_array=False, window_size=window_size)  # as mlx-lm models call it
    kv = mx.array([encode(t, start + i) for i, t in enumerate(tokens)], dtype=mx.float32).reshape(1, 1, S, 1)
    keys, values = cache.update_and_fetch(kv, kv + 0.5)
    keys = np.array(keys).reshape(-1)
    values = np.array(values).reshape(-1)
    assert np.array_equal(values, keys + 0.5)
    L = keys.size
    if mask is None:
        m = np.ones((S, L), bool)
    elif isinstance(mask, str):  # "causal": the last S keys are the new queries
        m = np.tril(np.ones((S, L), bool), k=L - S)
    else:
        m = np.broadcast_to(np.array(mask), (S, L))
    return [set(keys[m[i]].tolist()) for i in range(S)]


def expected(history, q, window, keep):
    pos = range(q + 1) if window is None else [p for p in range(q + 1) if p < keep or p > q - (window - keep)]
    return {encode(history[p], p) for p in pos}


class CacheMachine(RuleBasedStateMachine):
    @initialize(kind=st.sampled_from(["grow", "window4", "window0"]), window=st.integers(5, 24),
                headroom=st.integers(1, 9))
    def setup(self, kind, window, headroom):
        if kind == "grow":
            self.cache, self.window, self.keep = GrowingKVCache(), None, 0
        else:
            self.keep = 4 if kind == "window4" else 0
            self.cache, self.window = WindowKVCache(window, self.keep, headroom), window
        self.headroom = headroom
        self.history = []  # tokens at positions 0..offset-1
        self.hi = -1  # newest position ever written

    @rule(tokens=st.lists(st.integers(1, 50), min_size=1, max_size=10))
    def append(self, tokens):
        start = len(self.history)
        seen = visible_sets(self.cache, start, tokens)
        self.history.extend(tokens)
        self.hi = max(self.hi, len(self.history) - 1)
        for i, s in enumerate(seen):
            assert s == expected(self.history, start + i, self.window, self.keep), f"query {start + i}"

    @rule(n=st.integers(20, 70), tok=st.integers(1, 50))
    def prefill(self, n, tok):
        self.append([tok + (i % 7) for i in range(n)])

    @precondition(lambda self: len(self.history) > 0)
    @rule(data=st.data())
    def rollback(self, data):
        limit = len(self.history)
        if self.window is not None:  # the documented guarantee: up to `headroom` past the newest write
            limit = min(limit, len(self.history) - (self.hi - self.headroom))
        if limit <= 0:
            return
        n = data.draw(st.integers(1, limit))
        assert self.cache.can_trim(n)
        assert self.cache.trim(n) == n
        del self.history[-n:]

    @precondition(lambda self: len(self.history) > 0)
    @rule(data=st.data())
    def rollback_if_allowed(self, data):
        # Any rollback the cache accepts must leave it right: the next append checks every query.
        n = data.draw(st.integers(1, len(self.history)))
        if self.cache.can_trim(n):
            self.cache.trim(n)
            del self.history[-n:]

    @invariant()
    def offset_matches(self):
        if hasattr(self, "cache"):
            assert self.cache.offset == len(self.history)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_window_cache_refuses_rollback_it_cannot_honour():
    c = WindowKVCache(8, 4, headroom=2)
    for i in range(30):
        visible_sets(c, i, [i + 1])
    c.trim(2)
    assert c.can_trim(1)  # the next query (27) needs 24..26: still in the ring
    assert not c.can_trim(2)  # the query at 26 would need 23, already overwritten
    with pytest.raises(CacheRollbackError):
        c.trim(2)
    assert c.offset == 28  # nothing changed


def test_window_cache_refuses_a_long_rollback_into_overwritten_positions():
    # Back to position 15 after 71 writes: the query at 15 needs 4..14, long overwritten (a
    # second request sharing a short prefix must refill, not read the ring's newer entries).
    c = WindowKVCache(16, 4, headroom=33)
    for i in range(71):
        visible_sets(c, i, [i + 1])
    assert not c.can_trim(56)
    assert c.can_trim(67)  # back to 4: only the fixed slots are needed


def test_a_new_prompt_after_a_rollback_to_the_fixed_slots_can_roll_back_its_drafts():
    # A long request, then an unrelated prompt (rolled back to the `keep` slots): the new request's
    # rejected drafts must still roll back (the old request's newest write judged them once).
    c = WindowKVCache(16, 4, headroom=8)
    for i in range(71):
        visible_sets(c, i, [1])
    c.trim(67)
    history = [1] * 4
    for i in range(4, 30):
        history += [2, 3, 4]
        c.trim(0)
        seen = visible_sets(c, i, [2, 3, 4])
        assert seen[0] == expected(history, i, 16, 4)
        assert c.can_trim(2)
        c.trim(2)  # two drafts rejected
        del history[-2:]


def test_make_cache_follows_model_choice():
    g = tiny.make_gemma3(sliding_window=6)
    caches = make_cache(g)
    kinds = [(type(c).__name__, getattr(c, "window", None), getattr(c, "keep", None)) for c in caches]
    assert kinds == [("WindowKVCache", 6, 0), ("GrowingKVCache", None, None)] * 2
    caches = make_cache(g, max_kv_size=32)
    assert [(c.window, c.keep) for c in caches] == [(6, 0), (32, 4)] * 2


def test_make_cache_rejects_recurrent_layers():
    from mlx_lm.models.cache import ArraysCache

    class Recurrent:
        layers = [0, 1]

        def make_cache(self):
            return [ArraysCache(2), ArraysCache(2)]

    with pytest.raises(IncompatibleModelsError, match="ArraysCache"):
        make_cache(Recurrent())


def test_bad_window():
    for bad in (3, 4, True, 5.0):
        with pytest.raises(InvalidArgumentError, match="max_kv_size must be an integer >= 5"):
            make_cache(tiny.make_llama(), max_kv_size=bad)
    assert all(c.window == 5 for c in make_cache(tiny.make_llama(), max_kv_size=5))  # the narrowest allowed


def test_growing_cache_can_roll_back_all_it_holds_and_no_more():
    c = GrowingKVCache()
    visible_sets(c, 0, [1, 2, 3, 4, 5])
    assert [c.can_trim(n) for n in (-1, 0, 1, 5, 6)] == [False, True, True, True, False]


@pytest.mark.parametrize("window,keep,headroom,match", [
    (4, 4, 16, "window must be an integer > keep"),  # nothing would slide
    (3, 4, 16, "window must be an integer > keep"),
    (0, 0, 16, "window must be an integer > keep"),
    (8.0, 0, 16, "window must be an integer > keep"),
    (8, 0, 0, "headroom must be >= 1"),
])
def test_window_cache_arguments_are_checked(window, keep, headroom, match):
    with pytest.raises(InvalidArgumentError, match=match):
        WindowKVCache(window, keep, headroom)


def test_the_narrowest_window_sees_each_query_alone():
    c = WindowKVCache(1, 0, 1)
    for pos, tok in enumerate([7, 8, 9]):
        assert visible_sets(c, pos, [tok]) == [{encode(tok, pos)}]
    assert c.can_trim(1) and c.trim(1) == 1
    assert visible_sets(c, 2, [6]) == [{encode(6, 2)}]
    c5 = WindowKVCache(5, 4, 1)  # one sliding slot behind the four kept
    seen = [visible_sets(c5, pos, [10 + pos])[0] for pos in range(7)]
    assert seen[6] == {encode(10 + p, p) for p in (0, 1, 2, 3, 6)}


@pytest.mark.parametrize("chunk", [1, 3, 40])
def test_a_layers_own_narrower_window_narrows_what_each_query_sees(chunk):
    """A layer that passes its attention window to a wider cache (a user's max_kv_size) sees only
    that window, the cache's kept leading positions included."""
    c = WindowKVCache(24, 4, 8)
    history = list(range(100, 140))
    for start in range(0, len(history), chunk):
        part = history[start:start + chunk]
        got = visible_sets(c, start, part, window_size=6)
        for i, keys in enumerate(got):
            assert keys == expected(history, start + i, 6, 4)


def test_a_window_cache_grows_its_buffers_a_step_at_a_time_up_to_its_capacity():
    """Buffers grow WindowKVCache.step slots at a time, whatever the heads and head size, and
    never past its capacity (window + headroom slots)."""
    c = WindowKVCache(600, 4, 16)
    sizes = []
    for n in (256, 256, 64, 128, 128):
        kv = mx.zeros((1, 2, n, 8))
        c.make_mask(n)
        c.update_and_fetch(kv, kv)
        sizes.append(c.keys.shape[2])
    assert sizes == [256, 512, 616, 616, 616]  # (256 and 512 slots needed exactly: no step more)
    assert c.values.shape == c.keys.shape == (1, 2, 616, 8) and c.nbytes == 2 * 616 * 2 * 8 * 4


@pytest.mark.parametrize("keep", [0, 4])
@pytest.mark.parametrize("headroom", [1, 3, 16])
@pytest.mark.parametrize("chunk", [40, 60])
def test_after_a_long_chunk_the_whole_headroom_rolls_back(keep, headroom, chunk):
    """A chunk longer than the ring (a prefill) stores only its newest positions; those must still
    hold every key a query needs after rolling back all `headroom` tokens."""
    window = 12
    c = WindowKVCache(window, keep, headroom)
    history = [3 + i % 11 for i in range(chunk)]
    visible_sets(c, 0, history)
    assert c.can_trim(headroom)
    c.trim(headroom)
    del history[-headroom:]
    for tok in (50, 51):
        seen = visible_sets(c, len(history), [tok])
        history.append(tok)
        assert seen == [expected(history, len(history) - 1, window, keep)]


@pytest.mark.parametrize("chunks", [(240, 17, 1, 300), (255, 1, 17, 16, 300), (17, 239, 20)])
def test_writes_across_the_buffers_growth_see_the_window(chunks):
    """Chunks whose newest slot lands exactly on the buffers' end (256) grow them first; every query,
    in a window wider than one growth step, still sees exactly its window."""
    c, history = WindowKVCache(600, 4, 16), []
    for n in chunks:
        tokens = [3 + (len(history) + i) % 13 for i in range(n)]
        start = len(history)
        seen = visible_sets(c, start, tokens)
        history.extend(tokens)
        assert all(s == expected(history, start + i, 600, 4) for i, s in enumerate(seen))


def fed(cache, positions):
    """Write one entry per position, its key encoding the position (token 1), one write each."""
    for p in positions:
        x = mx.full((1, 1, 1, 2), encode(1, p))
        cache.update_and_fetch(x, x)


def key_at(cache, position):
    keys, _, pos = cache.stored(cache.offset)
    return float(keys[0, 0, int(np.flatnonzero(pos == position)[0]), 0])


def test_moved_entries_land_also_where_the_destinations_wrap_around_the_ring():
    c = WindowKVCache(6, 2, headroom=4)  # ring slots 2..9: position 10 takes slot 2 again
    fed(c, range(13))
    c.move([11, 12], [9, 10])  # destinations in slots 9 and 2: two runs of one
    assert (key_at(c, 9), key_at(c, 10)) == (encode(1, 11), encode(1, 12))
    assert key_at(c, 8) == encode(1, 8)  # untouched


def test_a_window_cache_answers_mlx_lm_s_questions():
    c = WindowKVCache(8, 4, headroom=2)
    assert c.empty() and c.nbytes == 0 and c.state == [] and c.is_trimmable()
    fed(c, range(3))
    assert not c.empty() and c.size() == 3 and c.nbytes == 2 * c.keys.nbytes > 0
    fed(c, range(3, 20))
    assert c.size() == 8  # the window, not everything fed
    assert not c.can_trim(-1) and not c.can_trim(21) and c.can_trim(0)


def test_a_cache_started_at_a_position_rolls_back_like_one_fed_up_to_it():
    started, full = WindowKVCache(6, 2, headroom=4), WindowKVCache(6, 2, headroom=4)
    started.start_at(20)
    fed(full, range(20))
    for more in ([], [20], [21, 22]):
        fed(started, more)
        fed(full, more)
        assert [started.can_trim(n) for n in range(24)] == [full.can_trim(n) for n in range(24)]
    again = WindowKVCache(6, 2)
    again.start_at(3)
    with pytest.raises(ValueError, match="start_at needs an empty cache"):
        again.start_at(5)
