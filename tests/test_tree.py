"""Tree passes through unmodified mlx-lm models, and cache compaction after them.

Every row of a tree pass must give the logits a sequential pass along its root-to-row path
gives; after `keep_path` the caches must behave exactly like caches that were fed the kept
history one chain at a time. Checked on a full-attention llama (growing cache), the same
with a sliding window that wraps (`max_kv_size`), gemma3's sliding-window layers, and a RoPE
variant that cannot take one offset per row in one call, against a Python model of the history.
A tree of one node (two rows) is checked too. Tolerance: float32 rounding of a different
summation order, a few hundred ulps of the logits' scale.
"""

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import tree
from mlxspec.sequence import Sequence

PARENTS = [-1, 0, 1, 0, -1, 4, 5, 2]  # depth 4, branching at the root and below node 0
CONFIGS = {
    "growing": (lambda: tiny.make_llama(7), None),
    "window": (lambda: tiny.make_llama(7), 12),
    "sliding layers": (lambda: tiny.make_gemma3(3, sliding_window=6), None),
    # mlx-lm's dynamic-NTK RoPE does arithmetic on its offset, so per-row offsets take one call per row
    "rope with offset arithmetic": (lambda: tiny.make_llama(7, rope_scaling={"type": "dynamic", "factor": 2.0}), None),
}


def tol(ref: mx.array) -> float:
    return 512 * float(np.finfo(np.float32).eps) * max(1.0, float(mx.max(mx.abs(ref))))


def reference_logits(model, max_kv, history):
    """Logits after the last token of `history`, from a fresh sequence fed it in one pass."""
    seq = Sequence(model, max_kv_size=max_kv, headroom=16)
    return seq.forward(history)[-1]


def path_to(r, parents):
    """Node indices root-to-node for fed row r (r = 0: the root, empty)."""
    out, i = [], r - 1
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.fixture(scope="module", params=list(CONFIGS))
def config(request):
    make, max_kv = CONFIGS[request.param]
    return make(), max_kv


def test_masks_follow_ancestry_and_positions_follow_depth():
    d = tree.depths(PARENTS)
    assert d.tolist() == [0, 1, 2, 3, 2, 1, 2, 3, 4]
    m = np.array(tree.mask(np.arange(5 + 9), 5, d, tree.ancestors(PARENTS), None, 0))
    assert m[:, :5].all()  # the committed keys
    assert m[3, 5:].tolist() == [True, True, True, True, False, False, False, False, False]  # root, 0, 1, 2
    assert m[8, 5:].tolist() == [True, True, True, True, False, False, False, False, True]  # root, 0, 1, 2, 7
    w = np.array(tree.mask(np.arange(5 + 9), 5, d, tree.ancestors(PARENTS), 4, 0))
    assert w[8, :8].tolist() == [False] * 6 + [True, True]  # row 8 sits at 9: sees 6..9 (window 4)


@pytest.mark.parametrize("parents", [PARENTS, [-1]], ids=["tree", "one node"])
def test_every_row_matches_a_sequential_pass(config, parents):
    model, max_kv = config
    rng = np.random.default_rng(0)
    prompt = rng.integers(3, 200, size=20).tolist()  # longer than the window: it has wrapped
    nodes = rng.integers(3, 200, size=len(parents)).tolist()
    seq = Sequence(model, max_kv_size=max_kv, headroom=16)
    seq.prefill(prompt[:-1])
    logits = seq.forward_tree([prompt[-1], *nodes], parents)[0]
    for r in range(len(parents) + 1):
        ref = reference_logits(model, max_kv, prompt + [nodes[i] for i in path_to(r, parents)])
        err = float(mx.max(mx.abs(logits[r] - ref)))
        assert err <= tol(ref), f"row {r}: max error {err:.2e}"


def test_compaction_against_a_python_history(config):
    """Random rounds (a tree, then one of its paths kept; or a chain rolled back in part): the
    sequence's tokens equal the modelled history and its next logits equal a fresh pass's."""
    model, max_kv = config
    rng = np.random.default_rng(1)
    history = rng.integers(3, 200, size=9).tolist()
    seq = Sequence(model, max_kv_size=max_kv, headroom=16)
    seq.prefill(history[:-1])
    for step in range(8):
        start = len(seq.tokens)
        if step % 3 == 2:  # a chain round, partly rejected
            drafts = rng.integers(3, 200, size=4).tolist()
            seq.forward([history[-1], *drafts])
            n = int(rng.integers(0, 5))
            seq.rollback(4 - n)
            kept = drafts[:n]
        else:
            parents = [-1] + [int(rng.integers(-1, i)) for i in range(1, 7)]
            nodes = rng.integers(3, 200, size=len(parents)).tolist()
            seq.forward_tree([history[-1], *nodes], parents)
            path = path_to(int(rng.integers(0, len(parents) + 1)), parents)
            seq.keep_path(start, path)
            kept = [nodes[i] for i in path]
        history.extend(kept)
        assert seq.tokens == history, f"round {step}"
        nxt = int(rng.integers(3, 200))
        got = seq.forward([nxt])[-1]
        ref = reference_logits(model, max_kv, history + [nxt])
        assert float(mx.max(mx.abs(got - ref))) <= tol(ref), f"round {step}: caches differ from the history"
        seq.rollback(1)
        history.append(nxt)  # the round's own next token: the root of the next round, not fed yet


def test_moves_only_for_paths_off_the_first_branch():
    assert tree.moves([0, 1, 2]) == ([], [])
    assert tree.moves([4, 5]) == ([5, 6], [1, 2])


def test_a_tree_pass_leaves_parameter_names_and_plain_passes_alone():
    """Per-row RoPE offsets come from a subclass of each rope's own class, not a wrapper: the
    module and parameter trees (what quantizing, adapters or reloading weights walk) keep their
    names, each rope is still an instance of its class, and plain passes give the same logits."""
    from mlx.utils import tree_flatten

    model = tiny.make_llama(7)
    x = mx.array([[5, 9, 2, 7]])
    names, before = [k for k, _ in tree_flatten(model.parameters())], model(x)
    modules = [(k, type(m)) for k, m in model.named_modules()]
    seq = Sequence(model, max_kv_size=None, headroom=16)
    seq.prefill([3, 4, 5])
    seq.forward_tree([6, 7, 8, 9], [-1, 0, 0])
    assert [k for k, _ in tree_flatten(model.parameters())] == names
    assert [k for k, _ in model.named_modules()] == [k for k, _ in modules]
    assert all(isinstance(m, cls) for (_, cls), (_, m) in zip(modules, model.named_modules()))
    assert mx.array_equal(model(x), before).item()
    model.load_weights(list(tree_flatten(model.parameters())))  # the names still load
