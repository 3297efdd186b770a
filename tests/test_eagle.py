"""EAGLE head drafter: cache rollback, lossless greedy and sampled decoding, loading errors."""

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import RotatingKVCache

import tiny
from mlxspec import Engine
from mlxspec.drafters import chaincopy
from mlxspec.drafters.eagle import FEED_WHOLE, EagleDrafter, load_head
from mlxspec.errors import IncompatibleModelsError, InvalidArgumentError, ModelNotFoundError
from mlxspec.sampling import SamplingParams, probabilities, race, race_noise
from mlxspec.sequence import Sequence
from test_engine import assert_same_greedy, reference
from test_engine_sampling import VOCAB as SAMPLING_VOCAB, assert_first_two_follow_the_target

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1, layers=1)


@pytest.fixture(scope="module")
def copy_head(target, tmp_path_factory):
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("copy"), copy=True)


@pytest.fixture(scope="module")
def random_head(target, tmp_path_factory):
    # A reduced draft vocabulary: every third id (tokens outside it are never proposed).
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("rand"), seed=3,
                                draft_ids=list(range(0, tiny.VOCAB, 3)))


@pytest.fixture(scope="module")
def deep_target():
    return tiny.make_llama(2, layers=3)


@pytest.fixture(scope="module")
def layered_head(deep_target, tmp_path_factory):
    # EAGLE-3-style: reads the outputs of the target's three layers.
    return tiny.make_eagle_head(deep_target, tmp_path_factory.mktemp("layered"), seed=4, feature_layers=[0, 1, 2],
                                draft_ids=list(range(0, tiny.VOCAB, 2)))


@pytest.fixture(scope="module")
def two_layer_head(target, tmp_path_factory):
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("two"), seed=5, num_layers=2,
                                draft_ids=list(range(0, tiny.VOCAB, 3)))


def drafter_for(target, head_dir, max_kv_size=None):
    head, ids, cfg = load_head(head_dir, target)
    seq = Sequence(target, max_kv_size=max_kv_size, headroom=17, keep_hidden=True,
                   hidden_layers=cfg.get("feature_layers") or ())
    return seq, EagleDrafter(head, ids, seq, max_kv_size=max_kv_size, headroom=17)


def head_outputs(drafter, history, k):
    """Draft tokens and the head's logits for the first draft token (to compare caches numerically)."""
    d = drafter.propose(history, k, GREEDY, 0)
    drafter._sync(history)
    h = drafter._feed(history, len(history) - 1)
    return d.tokens.tolist(), drafter.logits(h[0]).astype(mx.float32)


@pytest.mark.parametrize("max_kv_size", [None, 12])
@pytest.mark.parametrize("kind", ["final", "layered", "two_layer"])
def test_head_cache_rolls_back_to_what_a_fresh_head_computes(request, kind, max_kv_size):
    """Rounds of drafting with partial acceptance leave the head's cache (every layer's) as a
    fresh head builds it, also once the window (12 positions) has wrapped several times."""
    target, random_head = {
        "final": lambda: (request.getfixturevalue("target"), request.getfixturevalue("random_head")),
        "layered": lambda: (request.getfixturevalue("deep_target"), request.getfixturevalue("layered_head")),
        "two_layer": lambda: (request.getfixturevalue("target"), request.getfixturevalue("two_layer_head")),
    }[kind]()
    seq, drafter = drafter_for(target, random_head, max_kv_size)
    history = list(PROMPT)
    seq.prefill(history[:-1])
    drafter.prefill(history)
    rng = np.random.default_rng(0)
    for _ in range(12):
        k = int(rng.integers(1, 6))
        drafter.propose(history, k, GREEDY, 0)
        new = [int(t) for t in rng.integers(3, tiny.VOCAB, size=int(rng.integers(1, k + 2)))]
        seq.forward([history[-1], *new[:-1]])  # the target's verify pass commits them
        history += new
    got_tokens, got_logits = head_outputs(drafter, history, 4)
    seq2, fresh = drafter_for(target, random_head, max_kv_size)
    seq2.prefill(history[:-1])
    want_tokens, want_logits = head_outputs(fresh, history, 4)
    assert got_tokens == want_tokens
    tol = tiny.float32_tol()  # the two caches were fed in other chunks
    assert mx.allclose(got_logits, want_logits, atol=tol, rtol=tol).item()


@pytest.mark.parametrize("num_draft", [None, 1, 4])
def test_greedy_matches_plain_decoding(target, random_head, num_draft):
    ref = reference(target, PROMPT, 40)
    e = Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=num_draft)
    r = e.generate(PROMPT, max_tokens=40)
    assert_same_greedy(target, PROMPT, r.tokens, ref)
    assert r.stats.drafter == "eagle"


@pytest.mark.parametrize("W", [16, 37])
def test_greedy_with_a_window_matches_mlx_lm(target, copy_head, W):
    ref = reference(target, PROMPT, 100, [RotatingKVCache(max_size=W, keep=4) for _ in target.layers])
    e = Engine(target, None, eagle_head=copy_head, drafter="eagle", max_kv_size=W, num_draft=4)
    r = e.generate(PROMPT, max_tokens=100)
    assert_same_greedy(target, PROMPT, r.tokens, ref, max_kv_size=W)
    assert r.stats.accepted > r.stats.drafted / 2  # the copy head drafts what the target says


def _kept_rows(engine) -> int:
    return sum(rows.shape[0] for _, rows in engine.target._hidden)


@pytest.mark.parametrize("head", ["copy_head", "random_head"])
def test_behind_a_window_the_kept_features_stay_bounded_and_greedy_is_exact(request, target, head):
    """A long stream behind a window keeps the target features the head's window and a rollback
    can reach, not one per position; the output stays the target's."""
    W, n = 16, 600
    # Lookup rounds off: the head feeds (and lets go of features) every round; with them, rows
    # gather over a run of lookup rounds until its next round.
    e = Engine(target, None, eagle_head=request.getfixturevalue(head), drafter="eagle", max_kv_size=W, lookup=False)
    r = e.generate(PROMPT, max_tokens=n)
    # the window, both rollback rooms, a chunk straddling the cut, and the round the head has not fed yet
    bound = W + 2 * e.target.headroom + 2 * e.target.headroom
    assert len(r.tokens) == n and _kept_rows(e) <= bound < n / 3
    plain = Engine(target, None, max_kv_size=W).generate(PROMPT, max_tokens=n, speculative=False)
    assert r.tokens == plain.tokens
    assert r.stats.drafted > 0


def test_a_head_that_starts_over_behind_a_window_starts_where_the_features_begin(target, copy_head):
    """When the head's cache cannot roll back and its inputs before the window are gone, it
    starts at the first kept feature; drafting goes on and the output stays the target's."""
    W = 16
    e = Engine(target, None, eagle_head=copy_head, drafter="eagle", max_kv_size=W, num_draft=4)
    first = e.generate(PROMPT, max_tokens=200)
    assert e.target.first_hidden > 0  # features of the early positions were let go
    e.drafters["eagle"].reset()  # as a rollback its window cannot undo leaves it
    history = PROMPT + first.tokens
    again = e.generate(history, max_tokens=60)
    plain = Engine(target, None, max_kv_size=W).generate(history, max_tokens=60, speculative=False)
    assert again.tokens == plain.tokens
    assert again.stats.accepted >= 0.5 * again.stats.drafted > 0  # the copy head still drafts what the target says


def test_a_head_that_copies_the_target_is_accepted(target, copy_head):
    e = Engine(target, None, eagle_head=copy_head, drafter="eagle", num_draft=4)
    e.generate(PROMPT, max_tokens=8)  # a second request shares the prompt: rows come from the target's cache
    r = e.generate(PROMPT, max_tokens=60)
    # It lacks only the key of position 0: nearly every draft matches the target's argmax.
    assert r.stats.accepted >= 0.9 * r.stats.drafted > 0
    plain = e.generate(PROMPT, max_tokens=60, speculative=False)
    assert r.tokens == plain.tokens


@pytest.mark.parametrize("num_draft,window", [(None, None), (4, None), (4, 16)])
def test_two_layer_head_greedy_matches_plain_decoding(target, two_layer_head, num_draft, window):
    caches = None if window is None else [RotatingKVCache(max_size=window, keep=4) for _ in target.layers]
    ref = reference(target, PROMPT, 60, caches)
    e = Engine(target, None, eagle_head=two_layer_head, drafter="eagle", num_draft=num_draft, max_kv_size=window)
    r = e.generate(PROMPT, max_tokens=60)
    assert_same_greedy(target, PROMPT, r.tokens, ref, max_kv_size=window)
    eagle = e.drafters["eagle"]
    assert len(eagle.head.layers) == 2 and len(eagle.caches) == 2


def test_a_two_layer_head_runs_its_layers_in_order(deep_target, tmp_path):
    """Copying a two-layer target layer for layer drafts what it says; the same layers in the
    wrong order (or one skipped) would not."""
    two = tiny.make_llama(3, layers=2)
    head = tiny.make_eagle_head(two, tmp_path / "copy", copy=True)
    assert json.loads((head / "config.json").read_text())["num_layers"] == 2
    e = Engine(two, None, eagle_head=head, drafter="eagle", num_draft=4, lookup=False)  # the head's drafts alone
    e.generate(PROMPT, max_tokens=8)
    r = e.generate(PROMPT, max_tokens=60)
    assert r.stats.accepted >= 0.9 * r.stats.drafted > 0
    h, _, _ = load_head(head, two)
    h.layers = h.layers[::-1]
    swapped = tmp_path / "swapped"
    from mlxspec.drafters.eagle import save_head

    save_head(swapped, h, None, two, dtype=mx.float32)
    r2 = Engine(two, None, eagle_head=swapped, drafter="eagle", num_draft=4, lookup=False).generate(PROMPT, max_tokens=60)
    assert r2.stats.accepted < 0.9 * r2.stats.drafted


def test_a_failed_export_leaves_the_earlier_head_and_no_staged_file(target, tmp_path, monkeypatch):
    """save_head writes both files whole before renaming them: a full disk while the config is
    written leaves the earlier head loadable and nothing staged (which would block the rerun)."""
    from pathlib import Path

    from mlxspec.drafters.eagle import save_head

    folder = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    before = {f.name: f.read_bytes() for f in folder.iterdir()}
    head, ids, _ = load_head(folder, target)

    def full(self, *a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError, match="No space"):
        save_head(folder, head, ids, target, dtype=mx.float16)
    monkeypatch.undo()
    assert {f.name: f.read_bytes() for f in folder.iterdir()} == before
    load_head(folder, target)


def test_num_layers_must_be_a_whole_number(target, two_layer_head, tmp_path):
    cfg = json.loads((two_layer_head / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes((two_layer_head / "model.safetensors").read_bytes())
    for bad in (0, 1.5, "2", True):
        cfg["num_layers"] = bad
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(IncompatibleModelsError, match="num_layers"):
            load_head(tmp_path, target)
    cfg["num_layers"] = 1  # a config that says one layer over two layers' weights: the extra ones are named
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match=r"layers\.1\."):
        load_head(tmp_path, target)
    del cfg["num_layers"]  # heads written before num_layers existed have one layer
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleModelsError, match=r"layers\.1\."):
        load_head(tmp_path, target)


@pytest.mark.parametrize("tied,quantized", [(True, False), (False, False), (False, True)])
def test_output_rows_are_the_output_heads_rows(tied, quantized):
    """hidden @ output_rows(ids).T are exactly those ids' logits, whether the head is the tied
    embedding, an untied lm_head, or a quantized one."""
    import mlx.nn as nn

    from mlxspec.backbone import output_rows, split_model

    m = tiny.make_llama(2, layers=1, tie_embeddings=tied)
    if quantized:
        nn.quantize(m, group_size=32, bits=4)
    backbone, head = split_model(m)
    h = backbone(mx.array([PROMPT]))[0]  # (S, H)
    ids = mx.array(list(range(1, tiny.VOCAB, 5)))
    want = head(h)[:, ids]
    got = h @ output_rows(m, ids).T
    # The same products summed in another order: float32 roundoff on logits of size ~|want|.
    assert mx.allclose(got, want, atol=1e-4 * float(mx.abs(want).max()), rtol=0).item()


def test_an_untied_target_drafts_through_its_lm_head(tmp_path):
    """A copy head drafts what an untied target says only if its logits go through lm_head
    (the input embedding would score other tokens)."""
    t = tiny.make_llama(1, layers=1, tie_embeddings=False)
    e = Engine(t, None, eagle_head=tiny.make_eagle_head(t, tmp_path, copy=True), drafter="eagle", num_draft=4)
    r = e.generate(PROMPT, max_tokens=60)
    # Seeds 1-3 and two prompts: 0.6-0.87 accepted through lm_head, 0.0-0.33 through the embedding
    # (without the key of position 0 an untied target's text is less repetitive than a tied one's).
    assert r.stats.accepted >= 0.5 * r.stats.drafted > 0
    assert r.tokens == e.generate(PROMPT, max_tokens=60, speculative=False).tokens


def test_sampling_follows_the_target(tmp_path):
    """The first two sampled tokens follow the target's exact law with the head's q, which is zero
    outside its reduced vocabulary (the target's odd ids)."""
    params = SamplingParams(0.9, top_p=0.95)
    t = tiny.make_llama(5, vocab_size=SAMPLING_VOCAB, hidden=32, layers=1)
    head = tiny.make_eagle_head(t, tmp_path, seed=7, draft_ids=list(range(1, SAMPLING_VOCAB, 2)))
    assert_first_two_follow_the_target(Engine(t, None, eagle_head=head, drafter="eagle", num_draft=2), t, params)


def test_a_sampled_draft_is_the_targets_race_run_on_the_heads_law(target, random_head):
    """At a temperature the head's draft token is the race the target runs at that position
    (`sampling.race`, noise keyed by the seed, the position and the target's token ids) run on
    the head's q over its draft vocabulary: a function of the seed, never outside the vocabulary."""
    seq, drafter = drafter_for(target, random_head)
    seq.prefill(PROMPT[:-1])
    params = SamplingParams(1.0)
    drafts = [drafter.propose(PROMPT, 5, params, seed).tokens.tolist() for seed in range(24)]
    assert all(t % 3 == 0 for d in drafts for t in d)  # draft_ids = every third id
    _, logits = head_outputs(drafter, PROMPT, 1)
    q = probabilities(logits, params)[None]  # the first step's law over the draft vocabulary
    ids = mx.array(list(range(0, tiny.VOCAB, 3)))
    raced = [int(ids[race(q, race_noise(seed, [len(PROMPT)], ids))[0]].item()) for seed in range(24)]
    assert [d[0] for d in drafts] == raced
    assert len(set(raced)) > 3  # it sampled: the seeds gave different tokens


def test_a_head_s_trees_propose_target_ids_from_its_draft_vocabulary(target, random_head):
    """A reduced draft vocabulary's runners-up are mapped back to the target's ids, as its chain
    is: every node of a read tree and of a fixed-shape tree is one of the vocabulary's tokens."""
    seq, drafter = drafter_for(target, random_head)
    seq.prefill(PROMPT[:-1])
    read = drafter.propose_tree(PROMPT, 3, 12, GREEDY, 0)
    assert read.parents is not None and len(read) > 3  # the chain and side leaves
    drafter.reset()
    static = drafter.propose_static_tree(PROMPT, 3, 2, GREEDY, 0)
    nodes = list(read.tokens) + static.tokens.tolist()
    assert all(t % 3 == 0 for t in nodes), nodes  # draft_ids = every third id


def test_warmup_runs_the_head(target, random_head, monkeypatch):
    e = Engine(target, None, eagle_head=random_head, drafter="eagle")
    trees = []  # the head's tree drafts (runners-up) have kernels of their own: warmed too
    for kind in ("propose_tree", "propose_static_tree"):
        orig = getattr(EagleDrafter, kind)
        monkeypatch.setattr(EagleDrafter, kind, lambda self, *a, _o=orig, _k=kind: trees.append(_k) or _o(self, *a))
    fed = []  # a round's catch-up is one head call of any size up to FEED_WHOLE: warm-up runs each
    orig_step = EagleDrafter.head_step
    monkeypatch.setattr(EagleDrafter, "head_step", lambda self, t, *a, **kw: fed.append(t.shape[1]) or orig_step(self, t, *a, **kw))
    blends = []  # a chain's copy step compiles at its first call: warm-up makes one
    monkeypatch.setattr(chaincopy, "_blend", lambda *a, _o=chaincopy._blend: blends.append(1) or _o(*a))
    e.warmup()
    assert sorted(trees) == ["propose_static_tree", "propose_tree"]
    assert set(range(1, FEED_WHOLE + 1)) <= set(fed) and blends
    trees.clear()  # at a temperature: its fixed-shape trees too (their races' runners-up), never read ones
    e.warmup(temperatures=(0.7,))
    assert trees == ["propose_static_tree"]
    assert e.costs["eagle"].c.value() > 0  # the head's per-token cost is measured, not a prior
    assert e.target.tokens == [] and e.drafters["eagle"].entries == 0
    r = e.generate(PROMPT, max_tokens=20)
    assert r.stats.tokens == 20


def test_plain_engines_keep_no_hidden_states(target, random_head):
    assert not Engine(target).target.keep_hidden
    assert Engine(target, eagle_head=random_head).target.keep_hidden


# -- loading --------------------------------------------------------------------------------------

def test_drafter_eagle_needs_a_head(target):
    with pytest.raises(InvalidArgumentError, match="eagle_head"):
        Engine(target, drafter="eagle")


def test_missing_files(target, random_head, tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_head(tmp_path, target)
    (tmp_path / "config.json").write_text((random_head / "config.json").read_text())
    with pytest.raises(ModelNotFoundError, match="model.safetensors"):
        load_head(tmp_path, target)


def test_a_head_for_another_target_is_refused(random_head, tmp_path):
    same_shape = tiny.make_llama(9, layers=1)  # same vocabulary and width, other weights
    with pytest.raises(IncompatibleModelsError, match="fingerprint"):
        load_head(random_head, same_shape)
    wider = tiny.make_llama(1, layers=1, hidden=32)
    with pytest.raises(IncompatibleModelsError, match="hidden size 64 vs the target's 32"):
        load_head(random_head, wider)
    bigger_vocab = tiny.make_llama(1, layers=1, vocab_size=tiny.VOCAB + 7)
    with pytest.raises(IncompatibleModelsError, match=f"vocabulary size {tiny.VOCAB} vs the target's {tiny.VOCAB + 7}"):
        load_head(random_head, bigger_vocab)


def test_wrong_shapes_are_named(target, random_head, tmp_path):
    cfg = json.loads((random_head / "config.json").read_text())
    cfg["layer"]["intermediate_size"] *= 2
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((random_head / "model.safetensors").read_bytes())
    with pytest.raises(IncompatibleModelsError, match="gate_proj.weight"):
        load_head(tmp_path, target)


def _edited(random_head, tmp_path, edit=None, ids=None):
    """A copy of the head with its config edited by `edit(cfg)` and/or its draft_ids replaced."""
    cfg = json.loads((random_head / "config.json").read_text())
    cfg = edit(cfg) if edit else cfg
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    weights = mx.load(str(random_head / "model.safetensors"))
    if ids is not None:
        weights["draft_ids"] = mx.array(ids, dtype=mx.int32)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    return tmp_path


@pytest.mark.parametrize("edit,says", [
    (lambda c: [c], "model_type 'a JSON list'"),
    (lambda c: {k: v for k, v in c.items() if k != "layer"}, 'needs a "layer" object'),
    (lambda c: {**c, "layer": [1]}, 'needs a "layer" object'),
    (lambda c: {**c, "layer": {k: v for k, v in c["layer"].items() if k != "rope_theta"}}, "missing ['rope_theta']"),
    (lambda c: {**c, "layer": {**c["layer"], "colour": 1}}, "unknown ['colour']"),
    (lambda c: {**c, "layer": {**c["layer"], "num_attention_heads": "9"}}, "['num_attention_heads']"),
    (lambda c: {**c, "layer": {**c["layer"], "num_attention_heads": 0}}, "['num_attention_heads']"),
    (lambda c: {**c, "target": None}, "vocabulary size None"),
])
def test_a_config_that_is_not_a_head_s_is_said(target, random_head, tmp_path, edit, says):
    with pytest.raises((IncompatibleModelsError, ModelNotFoundError), match=re.escape(says)):
        load_head(_edited(random_head, tmp_path, edit), target)


@pytest.mark.parametrize("ids", [[-5, 3], [], [0, tiny.VOCAB]])
def test_draft_ids_outside_the_vocabulary_are_refused(target, random_head, tmp_path, ids):
    with pytest.raises(IncompatibleModelsError, match=rf"draft_ids .* ids in 0\.\.{tiny.VOCAB - 1}"):
        load_head(_edited(random_head, tmp_path, ids=ids), target)  # negative ones crashed the process


# -- EAGLE-3-style heads: the outputs of several target layers -----------------------------------

def test_tapped_layers_are_the_blocks_outputs(deep_target):
    from mlx.utils import tree_flatten
    from mlx_lm.models.base import create_attention_mask

    from mlxspec.backbone import TAP_EPS, split_model, tapped

    x = mx.array([PROMPT])
    names = [k for k, _ in tree_flatten(deep_target.parameters())]
    before = deep_target(x)
    run = tapped(deep_target, [0, 2])
    h, taps = run(x, None)
    m = deep_target.model
    y, outs = m.embed_tokens(x), []
    mask = create_attention_mask(y, None)
    for layer in m.layers:
        y = layer(y, mask, cache=None)
        outs.append(y)
    want = mx.concatenate([mx.fast.rms_norm(outs[i], None, TAP_EPS) for i in (0, 2)], axis=-1)
    assert taps.shape == (1, len(PROMPT), 2 * deep_target.args.hidden_size)
    assert mx.allclose(taps, want, atol=1e-5).item()
    assert mx.array_equal(split_model(deep_target)[1](h), before).item()
    for bad in ([], [0, 0], [3]):
        with pytest.raises(IncompatibleModelsError, match="distinct indices 0..2"):
            tapped(deep_target, bad)
    # Tapping changes nothing else: the same logits and parameter names, and a call outside
    # `run` (the chat's vanilla side sharing the target) records nothing.
    import mlxspec.backbone as bb

    assert mx.array_equal(deep_target(x), before).item()
    assert [k for k, _ in tree_flatten(deep_target.parameters())] == names
    assert getattr(bb._RECORD, "out", None) is None


@pytest.mark.parametrize("num_draft,window", [(None, None), (4, None), (4, 16)])
def test_layered_head_greedy_matches_plain_decoding(deep_target, layered_head, num_draft, window):
    caches = None if window is None else [RotatingKVCache(max_size=window, keep=4) for _ in deep_target.layers]
    ref = reference(deep_target, PROMPT, 60, caches)
    e = Engine(deep_target, None, eagle_head=layered_head, drafter="eagle", num_draft=num_draft, max_kv_size=window)
    r = e.generate(PROMPT, max_tokens=60)
    assert_same_greedy(deep_target, PROMPT, r.tokens, ref, max_kv_size=window)
    assert r.stats.drafter == "eagle" and (num_draft is None or r.stats.drafted > 0)
    assert e.target.hidden_since(0).shape[-1] == 3 * deep_target.args.hidden_size


def test_layered_head_sampling_follows_the_target(tmp_path):
    params = SamplingParams(0.9, top_p=0.95)
    t = tiny.make_llama(5, vocab_size=SAMPLING_VOCAB, hidden=32, layers=2)
    head = tiny.make_eagle_head(t, tmp_path, seed=7, feature_layers=[1, 0], draft_ids=list(range(1, SAMPLING_VOCAB, 2)))
    assert_first_two_follow_the_target(Engine(t, None, eagle_head=head, drafter="eagle", num_draft=2), t, params)


def test_feature_layers_that_do_not_fit_are_refused(deep_target, layered_head, random_head, tmp_path):
    cfg = json.loads((layered_head / "config.json").read_text())
    cfg["feature_layers"] = [0, 5]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((layered_head / "model.safetensors").read_bytes())
    with pytest.raises(IncompatibleModelsError, match=r"\[0, 5\].*3 layers.*0\.\.2"):
        load_head(tmp_path, deep_target)
    # A config that names layers over weights that have no fc_layers: the missing weights are named.
    cfg = json.loads((random_head / "config.json").read_text())
    cfg["feature_layers"] = [0]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((random_head / "model.safetensors").read_bytes())
    with pytest.raises(IncompatibleModelsError, match="fc_layers"):
        load_head(tmp_path, tiny.make_llama(1, layers=1))


@pytest.mark.parametrize("num_draft", [None, 3])
def test_a_cancelled_request_stops_and_the_engine_stays_right(target, random_head, num_draft):
    from test_engine import check_cancelled_requests

    check_cancelled_requests(lambda: Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=num_draft))


@pytest.mark.parametrize("num_draft", [None, 3])
def test_an_overtaken_stream_raises_and_the_engine_stays_right(target, random_head, num_draft):
    from test_engine import check_overtaken_streams

    check_overtaken_streams(lambda: Engine(target, None, eagle_head=random_head, drafter="eagle", num_draft=num_draft))


def test_a_prompt_of_whole_prefill_chunks_is_fed_to_the_head(tmp_path):
    """The head's catch-up of exactly k * prefill_step entries has no remainder chunk (it was an empty one)."""
    target = tiny.make_llama(0, tie_embeddings=False)
    head = tiny.make_eagle_head(target, tmp_path / "head")
    engine = Engine(target, tiny.make_tokenizer(), drafter="eagle", eagle_head=head, prefill_step=32)
    plain = Engine(target, tiny.make_tokenizer(), drafter="none", prefill_step=32)
    for n in (34, 66):  # the head feeds n - 2 entries before the first round: 32 and 64
        ids = [3 + (5 * i) % 200 for i in range(n)]
        engine.reset()
        assert engine.generate(ids, max_tokens=8).tokens == plain.generate(ids, max_tokens=8).tokens
