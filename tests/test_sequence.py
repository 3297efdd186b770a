"""Sequence: lazy (pipelined) tokens, hidden states kept beside the cache, rollback of both, tree passes and
passes that fail half-way."""

import mlx.core as mx
import pytest

import tiny
from mlxspec.backbone import split_model
from mlxspec.errors import IncompatibleModelsError
from mlxspec.sequence import Sequence

IDS = [5, 9, 14, 3, 7, 7, 21, 30, 8, 11]


@pytest.fixture(scope="module")
def model():
    return tiny.make_llama(4)


def full_pass(model, ids):
    """Cache-free reference: (hidden (S, H), logits (S, V))."""
    backbone, head = split_model(model)
    h = backbone(mx.array(ids, dtype=mx.uint32)[None], None)[0]
    return h, head(h)


def test_split_model_reproduces_logits(model):
    backbone, head = split_model(model)
    x = mx.array([IDS], dtype=mx.uint32)
    assert mx.array_equal(head(backbone(x)), model(x))


def test_split_model_refuses_a_non_linear_head(model):
    class SoftCapped:
        def __init__(self, m):
            self.m, self.model = m, m.model

        def __contains__(self, k):
            return k in self.m

        def __call__(self, x, cache=None):
            return mx.tanh(self.m(x, cache=cache) / 30) * 30

    with pytest.raises(IncompatibleModelsError, match="plain head"):
        split_model(SoftCapped(model))


def test_hidden_states_follow_prefill_forward_and_rollback(model):
    h_ref, logits_ref = full_pass(model, IDS)
    tol = tiny.float32_tol()  # chunked passes against one pass
    seq = Sequence(model, max_kv_size=None, headroom=8, keep_hidden=True)
    seq.prefill(IDS[:4])
    logits = seq.forward(IDS[4:9])
    assert mx.allclose(logits, logits_ref[4:9], atol=tol).item()
    assert mx.allclose(seq.hidden_since(0), h_ref[:9], atol=tol).item()
    seq.rollback(3)  # positions 6..8 rejected
    assert seq.tokens == IDS[:6] and seq.hidden_since(2).shape[0] == 4
    assert seq.hidden_since(6).shape == (0, h_ref.shape[1])  # nothing after the last position: no rows, not an error
    seq.forward(IDS[6:])
    assert mx.allclose(seq.hidden_since(0), h_ref, atol=tol).item()
    seq.release_hidden(5)  # the prompt's chunk (0-3) goes; the next (4-5) holds position 5
    assert mx.allclose(seq.hidden_since(4), h_ref[4:], atol=tol).item() and seq.first_hidden == 4
    seq.release_hidden(7)
    assert mx.allclose(seq.hidden_since(7), h_ref[7:], atol=tol).item()
    with pytest.raises(ValueError, match="released"):
        seq.hidden_since(3)
    seq.release_hidden(len(IDS) + 5)  # past every chunk: all go
    assert seq.first_hidden == len(IDS) and seq.hidden_since(len(IDS)).shape[0] == 0
    seq.forward(IDS[:3])  # one chunk, at positions 10-12
    seq.rollback(11)  # back to position 2, before every kept chunk: none is left to cut
    assert seq.first_hidden == len(seq.tokens) == 2 and seq.hidden_since(2).shape[0] == 0


def test_lazy_tokens_are_placeholders_until_settled(model):
    seq = Sequence(model, max_kv_size=None, headroom=8)
    seq.prefill(IDS[:5])
    nxt = mx.argmax(seq.forward([IDS[5]])[-1]).reshape(1)  # on the device, not read
    seq.forward(nxt)
    assert seq.tokens == IDS[:6] + [None]
    # Unsettled: a sync cannot trust the last position and rolls it back.
    assert seq.sync(IDS[:6] + [int(nxt.item()), 1]) == [int(nxt.item()), 1]
    seq.forward(nxt)
    seq.settle(6, [int(nxt.item())])
    assert seq.sync(IDS[:6] + [int(nxt.item()), 1]) == [1]


def test_a_pass_that_fails_half_way_leaves_the_caches_dirty_until_a_sync_rebuilds_them(model):
    failing = tiny.FailingOnce(model)
    seq = Sequence(failing, max_kv_size=None, headroom=8)
    seq.prefill(IDS[:6])
    assert not seq.dirty and seq.common_prefix(IDS) == 6
    failing.countdown = 1  # the next pass
    with pytest.raises(MemoryError):
        seq.forward(IDS[6:8])  # the caches hold 8 positions, the token list 6
    assert seq.dirty and seq.tokens == IDS[:6] and seq.caches[0].offset == 8
    assert seq.common_prefix(IDS) == 0  # nothing it holds can be trusted
    assert seq.sync(IDS) == IDS and not seq.dirty and seq.caches[0].offset == 0  # rebuilt from nothing
    _, ref = full_pass(model, IDS)
    tol = tiny.float32_tol()
    assert mx.allclose(seq.forward(IDS), ref, atol=tol).item()
    assert seq.tokens == IDS and not seq.dirty
    seq.reset()
    assert not seq.dirty and seq.tokens == [] and seq.common_prefix(IDS) == 0
    # A tree pass likewise: dirty while it may be half-written, clean once it was fed whole.
    seq.prefill(IDS[:6])
    seq.forward_tree(IDS[6:9], [-1, 0])
    assert not seq.dirty
    seq.keep_path(6, [0, 1])
    failing.countdown = 1
    with pytest.raises(MemoryError):
        seq.forward_tree([IDS[9], 1, 2], [-1, -1])
    assert seq.dirty and seq.tokens == IDS[:9] and seq.sync(IDS) == IDS


def test_a_tree_pass_keeps_the_features_of_the_path_it_keeps(model):
    parents = [-1, -1, 0, 1, 3]  # two branches from the root; the second three deep
    nodes = [40, 41, 42, 43, 44]
    path = [1, 3, 4]
    h_ref, _ = full_pass(model, IDS[:8] + [nodes[i] for i in path])
    tol = tiny.float32_tol()
    seq = Sequence(model, max_kv_size=None, headroom=8, keep_hidden=True)
    assert seq.prefill(IDS, stop=lambda: True) is False and seq.tokens == []  # stopped before its first chunk
    seq.prefill(IDS[:5])
    seq.forward(IDS[5:7])
    seq.forward_tree([IDS[7], *nodes], parents)
    assert seq.hidden_since(7).shape[0] == 1 + len(nodes)  # every row until a path is kept
    seq.keep_path(7, path)
    assert seq.tokens == IDS[:8] + [nodes[i] for i in path]
    assert seq.hidden_since(7).shape[0] == 1 + len(path)
    assert mx.allclose(seq.hidden_since(0), h_ref, atol=tol).item()
