"""A head that attends to the target's last-layer keys and values (`context: "target"`,
mlxspec/drafters/context.py): exact where it copies the target, lossless, window-aware, blind to
target positions past the history, and the training masks (scripts/train_eagle.py) are the ones
drafting has."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache

import tiny
from mlxspec import Engine
from mlxspec.drafters.eagle import EagleDrafter, load_head
from mlxspec.errors import IncompatibleModelsError
from mlxspec.prompts import MAX_DRAFT
from mlxspec.sampling import SamplingParams
from mlxspec.sequence import Sequence
from test_eagle import GREEDY, PROMPT, drafter_for
from test_engine import assert_same_greedy, reference
from test_engine_sampling import VOCAB as SAMPLING_VOCAB, assert_first_two_follow_the_target

from mlxspec.training import eagle_torch  # noqa: E402  (numpy only at import)
from mlxspec.training import eagle_training


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1, layers=1)


@pytest.fixture(scope="module")
def copy_head(target, tmp_path_factory):
    """The target's one layer and norm, fc = [I | 0]: reading the target's keys, it recomputes the
    target's next feature exactly (an EAGLE head copying it lacks the key of position 0)."""
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("ctxcopy"), copy=True, context="target")


@pytest.fixture(scope="module")
def random_head(target, tmp_path_factory):
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("ctxrand"), seed=3, context="target",
                                draft_ids=list(range(0, tiny.VOCAB, 3)))


def _plain_chain(target, history, k, max_kv_size):
    """The target's own next k greedy tokens after `history`, one token at a time in its own cache."""
    seq = Sequence(target, max_kv_size=max_kv_size, headroom=17)
    seq.forward(history[:-1])
    out, last = [], history[-1]
    for _ in range(k):
        last = int(mx.argmax(seq.forward([last])[-1]).item())
        out.append(last)
    return out


@pytest.mark.parametrize("max_kv_size", [None, 12])
def test_a_copy_of_the_target_drafts_exactly_its_chain(target, copy_head, max_kv_size):
    """Every round's chain of 4 is the target's own next 4 tokens, also once a window of 12 has
    wrapped: the head sees the target's keys at their positions, through the same window."""
    seq, drafter = drafter_for(target, copy_head, max_kv_size)
    drafter.copying = False  # the head's own drafts
    history = list(PROMPT)
    for _ in range(10):
        seq.reset()
        seq.forward(history[:-1])
        got = drafter.propose(history, 4, GREEDY, 0).tokens.tolist()
        want = _plain_chain(target, history, 4, max_kv_size)
        assert got == want
        history += want
    assert len(history) > 3 * 12


@pytest.mark.parametrize("window", [None, 16])
def test_a_copy_head_is_accepted_whole_and_lossless(target, copy_head, window):
    caches = None if window is None else [RotatingKVCache(max_size=window, keep=4) for _ in target.layers]
    ref = reference(target, PROMPT, 80, caches)
    e = Engine(target, None, eagle_head=copy_head, drafter="eagle", num_draft=4, max_kv_size=window, lookup=False)
    r = e.generate(PROMPT, max_tokens=80)
    assert_same_greedy(target, PROMPT, r.tokens, ref, max_kv_size=window)
    assert r.stats.accepted == r.stats.drafted > 0
    own = e.drafters["eagle"].caches[0].own  # a round's entries only, never the history's
    assert 0 < own.offset <= 1 + MAX_DRAFT
    if window:  # behind a window the target keeps the features a rollback can reach, not all
        assert e.target.first_hidden > 0


@pytest.mark.parametrize("num_draft,window", [(None, None), (4, None), (4, 16), (2, 37)])
def test_greedy_matches_plain_decoding(target, random_head, num_draft, window):
    caches = None if window is None else [RotatingKVCache(max_size=window, keep=4) for _ in target.layers]
    ref = reference(target, PROMPT, 60, caches)
    e = Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=num_draft, max_kv_size=window)
    r = e.generate(PROMPT, max_tokens=60)
    assert_same_greedy(target, PROMPT, r.tokens, ref, max_kv_size=window)
    assert r.stats.drafter == "eagle"


def test_sampling_follows_the_target(tmp_path):
    params = SamplingParams(0.9, top_p=0.95)
    t = tiny.make_llama(5, vocab_size=SAMPLING_VOCAB, hidden=32, layers=1)
    head = tiny.make_eagle_head(t, tmp_path, seed=7, context="target", draft_ids=list(range(1, SAMPLING_VOCAB, 2)))
    assert_first_two_follow_the_target(Engine(t, None, eagle_head=head, drafter="eagle", num_draft=2), t, params)


def _chain_features(drafter, history, tokens):
    """The head's features along a chain that drafts `tokens` (its first step, then one per token)."""
    h = drafter._feed(history, len(history) - 1)
    out = [h]
    for t in tokens:
        h = drafter.head_step(mx.array([[t]], dtype=mx.uint32), h[None])[0]
        out.append(h)
    return mx.concatenate(out)


@pytest.mark.parametrize("max_kv_size", [None, 12])
def test_target_positions_past_the_history_are_not_seen(target, random_head, max_kv_size):
    """Drafts rejected by the target but not yet rolled back (its cache holds positions past the
    history) change nothing at any draft step: the head reads the target's keys below the
    history's end only."""
    history = PROMPT + [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4]
    seq, drafter = drafter_for(target, random_head, max_kv_size)
    seq.forward(history[:-1])
    clean = _chain_features(drafter, history, [20, 21, 22])
    seq.forward([history[-1], 30, 31, 32])  # a verify pass whose drafts were rejected
    dirty = _chain_features(drafter, history, [20, 21, 22])
    # Equal up to float32 rounding: behind a window the cache holds the rejected keys in other
    # slots, and a BLAS may then sum the same products in another order (OpenBLAS's kernels on
    # some x86 chips do). Reading a rejected position would move the features far more.
    tol = tiny.float32_tol(1e-5)
    assert mx.allclose(dirty, clean, rtol=tol, atol=tol).item(), mx.abs(dirty - clean).max().item()


def test_teacher_forced_rows_are_each_entrys_first_step(target, random_head):
    seq, drafter = drafter_for(target, random_head)
    seq.forward(PROMPT[:-1])
    feats = drafter.head.lift(seq.hidden_since(0))
    rows = drafter.teacher_forced(mx.array(PROMPT[1:], dtype=mx.uint32), feats)
    for j in (0, 3, len(PROMPT) - 2):
        seq.reset()
        seq.forward(PROMPT[: j + 1])
        want = drafter._feed(PROMPT[: j + 2], j + 1)[0]
        tol = tiny.float32_tol()
        assert mx.allclose(rows[j], want, atol=tol, rtol=tol).item(), j


@pytest.mark.parametrize("window", [0, 5])
def test_the_mlx_trainer_computes_what_drafting_does(window, tmp_path):
    """mlxspec/training/eagle_objective.py with a context (how `train_eagle.py --target --context target`
    trains): steps 0 and 1 of every entry at once, from the target's keys made of its last layer's
    tapped input, equal the head drafting step by step over the target's cache (the round's first
    entry, then a drafted one); with the loss starting late (`window`), its windows too."""
    from mlxspec.training import eagle_objective as obj

    t = tiny.make_llama(4, layers=2)
    history = PROMPT + [3, 4, 5, 6]
    head, _, _ = load_head(tiny.make_eagle_head(t, tmp_path / "h", seed=2, context="target"), t)
    seq = Sequence(t, max_kv_size=None, headroom=17, keep_hidden=True)
    drafter = EagleDrafter(head, None, seq, max_kv_size=None, headroom=17)
    seq.forward(history[:-1])
    L = len(history) - 1
    x = t.model.layers[0](t.model.embed_tokens(mx.array(history[:-1])[None]), "causal")  # the last layer's input
    taps = x / mx.sqrt(mx.mean(x * x, axis=-1, keepdims=True) + 1e-6)  # tapped as the data stages store it
    emb = drafter.embed(mx.array(history[1:], dtype=mx.uint32))[None]
    preds = obj.unrolled(head, emb, seq.hidden_since(0)[None], 2, window, obj.context_kv(t, taps))
    starts = obj.window_starts(window, 2)
    tol = 10 * tiny.float32_tol()
    for j in range(max(starts[0], 1), L - 1):
        seq.reset()
        seq.forward(history[: j + 1])  # the target has run positions 0..j
        h0 = drafter._feed(history[: j + 2], j + 1)
        assert mx.allclose(preds[0][0, j - starts[0]], h0[0], atol=tol, rtol=tol).item(), (0, j)
        h1 = drafter.head_step(mx.array([[history[j + 2]]], dtype=mx.uint32), h0[None])[0]
        if j + 1 >= starts[1]:
            assert mx.allclose(preds[1][0, j + 1 - starts[1]], h1[0], atol=tol, rtol=tol).item(), (1, j)


def test_context_masks_by_hand():
    m = eagle_training.context_mask(4, 0, [0, 0])
    want = np.concatenate([np.tril(np.ones((4, 4))), np.eye(4)], axis=1).astype(bool)
    assert (m == want).all()  # entry j: the target's positions 0..j and itself
    m1 = eagle_training.context_mask(4, 1, [0, 0])
    assert m1.shape == (4, 12)
    # step 1 of entry 3: the target's 0..2, step 0's entry 2 (the bonus token's), itself
    assert m1[3].tolist() == [1, 1, 1, 0] + [0, 0, 1, 0] + [0, 0, 0, 1]
    assert m1[0].tolist() == [0] * 8 + [1, 0, 0, 0]


def _rewrite(head_dir, tmp_path, **changes):
    cfg = json.loads((head_dir / "config.json").read_text())
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((head_dir / "model.safetensors").read_bytes())
    return tmp_path


def test_bad_context_configs_say_what_is_allowed(target, random_head, tmp_path):
    assert json.loads((random_head / "config.json").read_text())["context"] == "target"
    with pytest.raises(IncompatibleModelsError, match="context 'nearby'.*head, target"):
        load_head(_rewrite(random_head, tmp_path, context="nearby"), target)
    with pytest.raises(IncompatibleModelsError, match="one decoder layer"):
        load_head(_rewrite(random_head, tmp_path, feature_layers=[0]), target)


def test_a_target_with_other_attention_shapes_is_refused(random_head):
    other = tiny.make_llama(1, layers=1, heads=4, kv_heads=4)  # the head reads 2 KV heads
    with pytest.raises(IncompatibleModelsError, match="2 KV heads"):
        load_head(random_head, other)


def test_the_pytorch_trainer_computes_what_drafting_does(tmp_path):
    """scripts/train_eagle.py's `losses` with a context (how a context head is trained): its steps 0
    and 1 (the target's keys from the tapped input of its last layer) equal the MLX head drafting
    over the target's cache, same weights, float32 both."""
    torch = pytest.importorskip("torch")
    import argparse

    from mlx.utils import tree_flatten

    H = 64
    t = tiny.make_llama(4, layers=2)
    head_dir = tiny.make_eagle_head(t, tmp_path / "h", seed=2, context="target")
    head, _, _ = load_head(head_dir, t)
    cfg = {"hidden_size": H, "intermediate_size": 2 * H, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": float(t.args.rope_theta), "num_layers": 1,
           "feature_layers": [], "context": "target"}
    theirs = eagle_torch.make_head(cfg)
    theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tree_flatten(head.parameters())}, strict=True)
    last = t.model.layers[-1]

    def linear(w):
        m = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
        m.weight.data = torch.from_numpy(np.array(w))
        return m

    w_norm = torch.from_numpy(np.array(last.input_layernorm.weight))
    norm = lambda x: w_norm * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)  # noqa: E731
    context = eagle_torch.context_kv_of(norm, linear(last.self_attn.k_proj.weight), linear(last.self_attn.v_proj.weight), cfg)
    history = PROMPT + [3, 4, 5, 6, 7]
    seq = Sequence(t, max_kv_size=None, headroom=17, keep_hidden=True)
    drafter = EagleDrafter(head, None, seq, max_kv_size=None, headroom=17)
    seq.forward(history[:-1])
    feats = np.array(seq.hidden_since(0))
    x = t.model.embed_tokens(mx.array(history[:-1])[None])
    x = t.model.layers[0](x, "causal")[0]  # the input of the last layer, tapped as the trainer stores it
    taps = np.array(x / mx.sqrt(mx.mean(x * x, axis=-1, keepdims=True) + 1e-6))
    ids = np.array(history, np.int32)
    # As a shard stores it: every id with its position's rows (the last row is never read as an input).
    batch = [(ids, np.concatenate([feats, feats[-1:]]), 3, np.concatenate([taps, taps[-1:]]))]
    args = argparse.Namespace(noise=0.0, loss_on="all", unroll=2, unroll_weight=0.8, ce_weight=0.3)
    emb = torch.from_numpy(np.array(t.model.embed_tokens.weight))
    w = torch.from_numpy(np.array(t.model.embed_tokens.weight))
    preds = []
    orig = theirs.step

    def step(*a, **kw):
        out = orig(*a, **kw)
        preds.append(out[0])
        return out

    theirs.step = step
    eagle_torch.losses(theirs, emb, w, batch, args, None, train=False, context=context)
    tol = 10 * tiny.float32_tol()
    L = len(history) - 1
    for j in range(1, L - 1):
        seq.reset()
        seq.forward(history[: j + 1])
        h0 = np.array(drafter._feed(history[: j + 2], j + 1)[0])
        assert np.allclose(preds[0][0, j].detach().numpy(), h0, atol=tol, rtol=tol), (0, j)
        h1 = drafter.head_step(mx.array([[history[j + 2]]], dtype=mx.uint32), mx.array(h0)[None, None])[0, 0]
        assert np.allclose(preds[1][0, j + 1].detach().numpy(), np.array(h1), atol=tol, rtol=tol), (1, j)


def test_warmup_runs_a_context_head_and_leaves_nothing_behind(target, random_head):
    e = Engine(target, None, eagle_head=random_head, drafter="eagle")
    e.warmup()
    assert e.costs["eagle"].c.value() > 0  # the head's per-token cost is measured, not a prior
    assert e.target.tokens == []
    r = e.generate(PROMPT, max_tokens=30)
    assert r.tokens == e.generate(PROMPT, max_tokens=30, speculative=False).tokens
