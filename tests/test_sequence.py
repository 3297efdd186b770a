"""Sequence: lazy (pipelined) tokens, hidden states kept beside the cache, rollback of both."""

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
    seq.forward(IDS[6:])
    assert mx.allclose(seq.hidden_since(0), h_ref, atol=tol).item()
    seq.release_hidden(7)
    assert mx.allclose(seq.hidden_since(7), h_ref[7:], atol=tol).item()
    with pytest.raises(ValueError, match="released"):
        seq.hidden_since(3)


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
