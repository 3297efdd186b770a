"""Gemma 2 (`mlxspec.models.gemma2`): its GGUF files against the NumPy reference, the sliding
window that mlx-lm's own `gemma2` leaves out, and lossless speculation across that window."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx

from tiny import float32_tol
from mlxspec import Engine
from mlxspec.loading import load_model

from gguf_reference import check_logits, reference_logits
from tiny_gguf import write_tiny_gguf

WINDOW = 4
TEXT = "def hello(name): 12345 and more words, well past the window"


@pytest.fixture(scope="module")
def gemma2_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma2") / "gemma2.gguf"
    sp = write_tiny_gguf(path, arch="gemma2", pre="spm-no-prefix", layers=4, window=WINDOW, head_dim=24,
                         seed=21)
    return path, sp


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_gemma2_logits_match_numpy_reference(gemma2_file, dtype, tol):
    # Gemma 2: Gemma's four norms per layer stored as 1 + w, GELU, a scaled input, a window on
    # the even layers, tanh caps on the attention scores and the logits, a head dim other than
    # hidden / heads, a tied output, Gemma's vocabulary without a space prefix.
    tol = tol or float32_tol()
    path, sp = gemma2_file
    model, tok, info = load_model(path, dtype=dtype)
    assert type(model).__module__ == "mlxspec.models.gemma2" and info.context_length == 256
    ids = tok.encode(TEXT)
    assert ids == [sp.bos_id()] + sp.encode(TEXT) and len(ids) > 3 * WINDOW
    check_logits(model, path, ids, tol)


def test_mlx_lms_own_gemma2_has_no_window(gemma2_file):
    # Why the module exists: the same weights in mlx-lm's gemma2 attend past the window, so its
    # logits leave the reference once the text is longer than the window (and only then).
    from mlx_lm.models import gemma2

    path, _ = gemma2_file
    ours, tok, _ = load_model(path, dtype="float32")
    theirs = gemma2.Model(ours.args)
    theirs.update(ours.parameters())
    ids = mx.array([tok.encode(TEXT)])
    a, b = np.array(ours(ids)[0]), np.array(theirs(ids)[0])
    scale = np.abs(a).max()
    assert np.abs(a[:WINDOW] - b[:WINDOW]).max() <= float32_tol() * scale
    assert np.abs(a[2 * WINDOW:] - b[2 * WINDOW:]).max() > 100 * float32_tol() * scale


def test_gemma2_decodes_as_the_reference(gemma2_file):
    # Token by token through the engine's caches (the window in a ring), each greedy token is
    # the reference's argmax wherever a rounding cannot flip it.
    from mlxspec.cache import WindowKVCache, make_cache

    path, _ = gemma2_file
    model, tok, _ = load_model(path, dtype="float32")
    # the windowed layers keep a ring of the window (and rollback headroom), not the whole text
    assert [isinstance(c, WindowKVCache) for c in make_cache(model)] == [True, False, True, False]
    prompt = tok.encode("hello hello hello world")
    plain = Engine(model, tok, None, drafter="none").generate(prompt, max_tokens=24)
    ref = reference_logits(path, prompt + list(plain.tokens))[len(prompt) - 1 : -1]
    top2 = np.sort(ref, axis=-1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-3 * np.abs(ref).max()
    assert clear.sum() >= 20 and (ref.argmax(-1) == np.array(plain.tokens))[clear].all()


@pytest.mark.parametrize("max_kv", [None, 12])
def test_gemma2_speculation_stays_lossless_across_the_window(gemma2_file, max_kv):
    # Chains and trees roll the windowed layers' rings back; the tokens stay plain decoding's.
    from test_engine_trees import check_chains_and_trees_decode_plainly

    path, _ = gemma2_file
    model, tok, _ = load_model(path, dtype="float32")
    check_chains_and_trees_decode_plainly(model, tok, max_kv_size=max_kv)


def test_an_mlx_folder_of_gemma2_gets_the_window(tmp_path):
    # mlx-lm's folder loader builds our Gemma 2 for model_type "gemma2" (its config names the window).
    from mlx_lm.utils import save_config, save_model

    from mlxspec.models import gemma2

    args = gemma2.ModelArgs(model_type="gemma2", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                            vocab_size=300, sliding_window=5, max_position_embeddings=512,
                            query_pre_attn_scalar=16)
    model = gemma2.Model(args)
    save_model(tmp_path, model)
    save_config(dict(vars(args)), tmp_path / "config.json")
    import tiny

    tiny.make_tokenizer().save_pretrained(str(tmp_path))
    loaded, _, info = load_model(tmp_path)
    assert type(loaded).__module__ == "mlxspec.models.gemma2"
    assert loaded.args.sliding_window == 5 and info.context_length == 512


@pytest.mark.parametrize("rows", [2, 3])
def test_a_batch_of_left_padded_rows_each_gets_its_own_answer(rows):
    """mlx-lm's batched generation (how `train_eagle.py --target` answers prompts) pads rows on
    the left and masks each row (B, 1, L, T). Gemma 2's attention groups the heads that share keys
    as (B, KV heads, repeats, L, T): the mask needs the repeats' axis, else 2 rows (as many as the
    KV heads here) take each other's padding and 3 raise."""
    import tiny
    from mlx_lm.generate import batch_generate

    model = tiny.make_gemma2(4, sliding_window=WINDOW)
    assert model.args.num_key_value_heads == 2 < model.args.num_attention_heads
    tok = tiny.make_tokenizer()
    prompts = [tok.encode(p) for p in ("hi", "a much longer prompt than that", "mid length one")[:rows]]
    got = batch_generate(model, tok, prompts, max_tokens=12, return_token_ids=True).token_ids
    for p, g in zip(prompts, got):
        want = Engine(model, None).generate(p, max_tokens=12, speculative=False).tokens
        assert list(g)[:len(want)] == want


def test_gemma2_s_real_window_of_4096_across_its_edge(tmp_path):
    """The engine's rings at Gemma 2's own window (4,096): plain decoding past the edge is the
    windowed model's one-pass argmax, mlx-lm's windowless model differs there, and chains and an
    EAGLE head's trees (its runners-up) give plain decoding's tokens."""
    import tiny
    from mlx_lm.models import gemma2 as theirs
    from test_engine_trees import flat_curve

    model = tiny.make_gemma2(11, sliding_window=4096, cap=30.0)
    rng = np.random.default_rng(0)
    block = rng.integers(3, tiny.VOCAB, 61).tolist()
    prompt = (block * 70)[:4080]  # repeats, so the n-gram drafter drafts; the answer crosses 4,096
    plain = Engine(model, None, drafter="none").generate(prompt, max_tokens=40)
    seq = mx.array([prompt + plain.tokens[:-1]])
    whole = model(seq)[0, len(prompt) - 1:].astype(mx.float32)  # one pass, the window as a mask
    top2 = mx.sort(whole, axis=-1)[:, -2:]
    clear = np.array(top2[:, 1] - top2[:, 0] > 1e-3 * mx.abs(whole).max())
    assert clear.sum() >= 30 and (np.array(mx.argmax(whole, -1)) == np.array(plain.tokens))[clear].all()
    # the rings' logits past the edge, chunked and rolled back as rounds do, against the one pass
    from mlxspec.sequence import Sequence

    ring = Sequence(model, max_kv_size=None, headroom=17)
    ring.prefill(prompt[:-1])
    answer = [prompt[-1]] + plain.tokens[:-1]
    got = [ring.forward(answer[:5])[:3]]
    ring.rollback(2)  # two drafts rejected: their rows too
    got.append(ring.forward(answer[3:23]))
    got.append(ring.forward(answer[23:]))
    got = mx.concatenate(got).astype(mx.float32)
    assert mx.allclose(got, whole, atol=tiny.float32_tol() * float(mx.abs(whole).max()), rtol=0).item()
    windowless = theirs.Model(model.args)
    windowless.update(model.parameters())
    late = slice(4096 - len(prompt) + 1, None)  # rows whose query sees past the window
    assert not mx.allclose(windowless(seq)[0, len(prompt) - 1:][late], whole[late], atol=1e-3).item()
    chain = Engine(model, None, drafter="ngram", num_draft=3, tree="off").generate(prompt, max_tokens=40)
    head = tiny.make_eagle_head(model, tmp_path, seed=2)
    trees = flat_curve(Engine(model, None, eagle_head=head, drafter="eagle", lookup=False))
    trees = trees.generate(prompt, max_tokens=40)
    assert chain.tokens == trees.tokens == plain.tokens
    assert chain.stats.drafted > 0 and trees.stats.tree_rounds > 0
