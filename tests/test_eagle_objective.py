"""The MLX training objective (mlxspec/training/eagle_objective.py) computes what drafting computes: its
unrolled steps, with their masks, equal the head run step by step through its KV cache, as the
engine drafts; the loss and agreement counts follow their definitions."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import KVCache
from mlx_lm.models.llama import ModelArgs

from mlxspec.drafters.eagle import EagleHead

from mlxspec.training import eagle_objective as obj

H, L = 32, 9
TOL = 1e-4  # float32 on every backend: the two paths differ only in summation order


def _head(layers=1, taps=0, seed=0):
    mx.random.seed(seed)
    args = ModelArgs(model_type="llama", hidden_size=H, num_hidden_layers=layers, intermediate_size=48,
                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=50,
                     head_dim=8, rope_theta=10000.0, max_position_embeddings=64)
    head = EagleHead(args, taps=taps)
    head.set_dtype(mx.float32)
    return head


def _torch_cfg(layers):
    """`_head`'s shape as scripts/train_eagle.py's PyTorch `make_head` takes it."""
    return {"hidden_size": H, "intermediate_size": 48, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "num_layers": layers, "feature_layers": []}


def _drafted(head, emb, feat, j, s):
    """Entry j of step s, as drafting makes it: real entries 0..j-s-1 in the cache, then s+1 steps."""
    cache = [KVCache() for _ in head.layers]
    r = j - s  # the real entry whose output starts the chain
    out = head(emb[:, : r + 1], feat[:, : r + 1], cache)[:, -1:]
    for t in range(r + 1, j + 1):
        out = head(emb[:, t : t + 1], out, cache)
    return out[0, 0]


@pytest.mark.parametrize("layers,taps", [(1, 0), (2, 0), (1, 3)])
def test_unrolled_steps_equal_step_by_step_drafting(layers, taps):
    head = _head(layers, taps)
    mx.random.seed(1)
    emb = mx.random.normal((1, L, H))
    kept = mx.random.normal((1, L, taps * H if taps else H))
    feat = head.lift(kept)
    preds = obj.unrolled(head, emb, feat, 3)
    for s in range(3):
        for j in range(s, L):
            want = _drafted(head, emb, feat, j, s)
            assert mx.abs(preds[s][0, j] - want).max().item() < TOL, (s, j)


def test_padding_after_a_sequence_changes_nothing_before_it():
    head = _head(2)
    mx.random.seed(2)
    emb, feat = mx.random.normal((2, L, H)), mx.random.normal((2, L, H))
    short = obj.unrolled(head, emb[:1, :5], feat[:1, :5], 2)
    padded = obj.unrolled(head, emb, feat, 2)
    for a, b in zip(short, padded):
        assert mx.abs(a[0] - b[0, :5]).max().item() < TOL


@pytest.mark.parametrize("layers,taps,steps", [(1, 0, 2), (2, 0, 3), (1, 3, 3)])
def test_windows_compute_the_same_predictions(layers, taps, steps):
    """With the loss starting at entry `first`, each step computes only its window: the same
    predictions there as computing every entry, for any start (clipped at 0 or not)."""
    head = _head(layers, taps)
    mx.random.seed(4)
    emb = mx.random.normal((2, L, H))
    feat = head.lift(mx.random.normal((2, L, taps * H if taps else H)))
    full = obj.unrolled(head, emb, feat, steps)
    for first in (1, steps - 1, steps, 6):
        starts = obj.window_starts(first, steps)
        assert starts[-1] == first and starts == sorted(starts)
        for s, pred in enumerate(obj.unrolled(head, emb, feat, steps, first)):
            assert pred.shape[1] == L - starts[s]
            assert mx.abs(pred - full[s][:, starts[s]:]).max().item() < TOL, (first, s)


def test_windowed_loss_equals_the_full_loss():
    head = _head(2)
    mx.random.seed(5)
    B, N = 3, 11
    emb, feat, tgt = mx.random.normal((B, L, H)), mx.random.normal((B, L, H)), mx.random.normal((B, L, H))
    w = mx.random.normal((N, H))
    weights = np.zeros((B, L), np.float32)
    weights[0, 5:], weights[1, 4:7], weights[2, 6:] = 1, 1, 1
    first = obj.first_loss_entry(weights)
    assert first == 4 and obj.first_loss_entry(np.zeros((B, L))) == 0
    kw = dict(steps=3, unroll_weight=0.8, ce_weight=0.3)
    full, agree_full = obj.loss(head, emb, feat, tgt, mx.array(weights), w, **kw)
    win, agree_win = obj.loss(head, emb, feat, tgt, mx.array(weights), w, first=first, **kw)
    assert abs(win.item() - full.item()) < TOL * max(1.0, abs(full.item()))
    assert agree_win.tolist() == agree_full.tolist()


def test_masks_by_hand():
    m = obj.step_mask(4, 1, [0, 0])
    # step 1: entry j sees real entries 0..j-1 and itself (the second half's diagonal)
    want = np.concatenate([np.tril(np.ones((4, 4)), -1), np.eye(4)], axis=1).astype(bool)
    assert (m == want).all()
    m2 = obj.step_mask(4, 2, [0, 0, 0])
    assert m2.shape == (4, 12)
    assert m2[3].tolist() == [1, 1, 0, 0] + [0, 0, 1, 0] + [0, 0, 0, 1]  # real 0..1, step 1 at 2, itself
    assert m2[0].tolist() == [0] * 8 + [1, 0, 0, 0]  # nothing real before it: only itself


@pytest.mark.parametrize("post", [None, "softcap", "divide"])
def test_loss_and_agreement_follow_their_definitions(post):
    """The loss by hand; with a target's logit map (Gemma 2's cap at 2, Granite's scale 0.25) both
    laws are of the mapped logits, as the target's and the drafter's are."""
    from mlxspec.backbone import LogitMap

    post = post and LogitMap(post, 2.0 if post == "softcap" else 0.25)
    mapped = (lambda z: z) if post is None else (lambda z: np.array(post(mx.array(z))))
    head = _head()
    mx.random.seed(3)
    B, N = 2, 11
    emb, feat, tgt = mx.random.normal((B, L, H)), mx.random.normal((B, L, H)), mx.random.normal((B, L, H))
    w = mx.random.normal((N, H))
    weights = mx.array(np.array([[0] * 3 + [1] * 6, [1] * 5 + [0] * 4], np.float32))
    total, agree = obj.loss(head, emb, feat, tgt, weights, w, steps=2, unroll_weight=0.5, ce_weight=0.3, post=post)
    preds = obj.unrolled(head, emb, feat, 2)
    sel = np.array(weights).astype(bool)
    p_t = np.array(mx.softmax(mx.array(mapped(np.array(tgt @ w.T))), axis=-1))[sel]
    want, counts = 0.0, []
    for s, pred in enumerate(preds):
        pr, tg = np.array(pred)[sel], np.array(tgt)[sel]
        d = np.abs(pr - tg)
        reg = np.where(d < 1, 0.5 * d * d, d - 0.5).mean()
        logits = mapped(pr @ np.array(w).T)
        logq = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
        ce = -(p_t * logq).sum(-1).mean()
        want += (reg + 0.3 * ce) * 0.5 ** s
        counts.append(int((logq.argmax(-1) == p_t.argmax(-1)).sum()))
    assert abs(total.item() - want) < 1e-4 * max(1.0, abs(want))
    assert [int(a) for a in agree.tolist()] == counts


@pytest.mark.parametrize("layers", [1, 2])
def test_matches_the_pytorch_objective_on_the_same_weights_and_batch(layers):
    """scripts/train_eagle.py's PyTorch `losses` (how the demo head was trained) and this objective,
    from the same head weights on the same padded batch: the same loss, the same agreement counts
    and the same gradients (float32 both; they differ in summation order only). Both compute
    only the windows the loss needs (the prompts here are long enough for a window to start
    late); the MLX objective also computing every entry gives the same again."""
    torch = pytest.importorskip("torch")
    import argparse

    from mlxspec.training import eagle_torch
    import tiny
    from mlxspec.training import train_eagle_mlx
    from mlx.utils import tree_flatten

    model = tiny.make_llama(3, tie_embeddings=False, hidden=H, heads=4, kv_heads=2)
    head = _head(layers=layers)
    theirs = eagle_torch.make_head(_torch_cfg(layers))
    mine = {k: np.array(v) for k, v in tree_flatten(head.parameters())}
    theirs.load_state_dict({k: torch.from_numpy(v) for k, v in mine.items()}, strict=True)
    rng = np.random.default_rng(0)
    batch = []
    for n, p in ((12, 6), (9, 5), (10, 7)):
        ids = rng.integers(0, tiny.VOCAB, n).astype(np.int32)
        batch.append((ids, rng.normal(size=(n, H)).astype(np.float16), p, None))
    vocab = np.sort(rng.choice(tiny.VOCAB, 40, replace=False)).astype(np.int32)
    from mlxspec.backbone import output_rows

    w = output_rows(model, mx.array(vocab)).astype(mx.float32)
    args = argparse.Namespace(noise=0.0, loss_on="answers", unroll=2, unroll_weight=0.8, ce_weight=0.3)
    emb_t = torch.from_numpy(np.array(model.model.embed_tokens.weight.astype(mx.float32)))
    loss_t, agree_t, _ = eagle_torch.losses(theirs, emb_t, torch.from_numpy(np.array(w)), batch, args, None,
                                            train=False)
    loss_t.backward()
    emb, feat, tgt, wt = train_eagle_mlx.batch_arrays(batch, model, 0.0, None)
    first = obj.first_loss_entry(wt)
    assert obj.window_starts(first, 2) == [2, 3]

    def f(emb, feat, tgt, wt, first):
        return obj.loss(head, emb, feat, tgt, wt, w, steps=2, unroll_weight=0.8, ce_weight=0.3, first=first)

    import mlx.nn as nn

    (loss_full, agree_full), _ = nn.value_and_grad(head, f)(emb, feat, tgt, wt, 0)
    (loss_m, agree_m), grads = nn.value_and_grad(head, f)(emb, feat, tgt, wt, first)
    for lm, am in ((loss_m, agree_m), (loss_full, agree_full)):
        assert abs(lm.item() - loss_t.item()) < 1e-5 * max(1.0, abs(loss_t.item()))
        assert [int(a) for a in am.tolist()] == [int(a) for a in agree_t]
    g_t = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    for k, g in tree_flatten(grads):
        scale = max(np.abs(g_t[k]).max(), 1e-6)
        assert np.abs(np.array(g) - g_t[k]).max() < 1e-4 * scale, k
    # and one optimiser step as each trainer takes it: clip to norm 0.5, then AdamW
    import mlx.optimizers as optim

    opt_t = torch.optim.AdamW(theirs.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.0)
    torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.5)
    opt_t.step()
    opt_m = train_eagle_mlx.optimizer(1e-2)
    grads, _ = optim.clip_grad_norm(grads, 0.5)
    opt_m.update(head, grads)
    after = {k: p.detach().numpy() for k, p in theirs.named_parameters()}
    # Adam's first step moves each weight by about lr * g / (|g| + eps): where |g| is near eps
    # (1e-8), float noise in g moves it by up to lr, so compare where |g| >= 100 eps.
    clipped = {k: p.grad.numpy() for k, p in theirs.named_parameters()}
    for k, v in tree_flatten(head.parameters()):
        moved = np.abs(after[k] - mine[k]).max()
        sure = np.abs(clipped[k]) >= 1e-6
        assert sure.mean() > 0.9, k
        assert np.abs(np.array(v) - after[k])[sure].max() < 1e-3 * max(moved, 1e-6), k


def test_bfloat16_steps_compute_the_float32_loss_to_bfloat16s_precision():
    """train_eagle.py --precision bfloat16: the same batch and weights give the float32 loss and
    gradients to within what bfloat16's rounding allows (8 significant bits, 2^-8 relative per
    rounding, a few matmuls deep), and the arithmetic really changed (not bit-identical)."""
    torch = pytest.importorskip("torch")
    import argparse

    from mlxspec.training import eagle_data
    from mlxspec.training import eagle_torch

    torch.manual_seed(0)
    head = eagle_torch.make_head(_torch_cfg(1))
    rng = np.random.default_rng(0)
    batch = [(rng.integers(0, 50, n).astype(np.int32), rng.normal(size=(n, H)).astype(np.float16), p, None)
             for n, p in ((12, 6), (9, 5), (10, 7))]
    emb = torch.from_numpy(rng.normal(size=(50, H)).astype(np.float32))
    w = emb[torch.arange(0, 50, 2)]
    args = argparse.Namespace(noise=0.0, loss_on="answers", unroll=2, unroll_weight=0.8, ce_weight=0.3)
    out = {}
    for precision in ("float32", "bfloat16"):
        head.zero_grad()
        with eagle_data.step_arithmetic(precision):
            loss, _, _ = eagle_torch.losses(head, emb, w, batch, args, None, train=False)
        loss.backward()
        assert loss.dtype == torch.float32
        grad = torch.cat([q.grad.flatten() for q in head.parameters()])
        out[precision] = (loss.item(), grad, [q.grad.dtype for q in head.parameters()])
    (l32, g32, _), (l16, g16, dtypes) = out["float32"], out["bfloat16"]
    assert all(d == torch.float32 for d in dtypes)  # the weights' gradients stay float32
    eps = 2.0 ** -8
    assert l16 != l32  # autocast engaged
    assert abs(l16 - l32) <= 8 * eps * abs(l32)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) >= 1 - 8 * eps
