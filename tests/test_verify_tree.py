"""Statistical tests of tree verification (`verify_tree`) and of the target-walk rule (`walk_tree`).

For target rows p and a tree of candidates, the first output token must be distributed as
p[0] and, given that the round accepted node i, the token after it as p[i+1], at every
depth. Each empirical distribution is compared bin by bin with a binomial bound: z standard
deviations, z from a Bonferroni correction over every bin the test checks (family-wise
false-alarm rate 1e-6), so the tolerance follows from the sample size.
"""

from statistics import NormalDist

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.errors import InvalidArgumentError
from mlxspec.verify import verify_tree, verify_tree_with_uniforms, walk_tree

V = 6
DRAWS = 20_000
# A tree of depth 3 with siblings at two levels: root -> 0, 1, 2; 0 -> 3, 4; 3 -> 5; 1 -> 6.
PARENTS = [-1, -1, -1, 0, 0, 3, 1]
RANKS = [0, 1, 2, 0, 1, 0, 0]  # each node's place among its siblings


def softmax_rows(rng, n, scale=3.0):
    z = rng.normal(size=(n, V)) * scale
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def outputs(path, nxt, tokens):
    """The tokens a round emits: the accepted nodes' tokens, then the next token."""
    return [tokens[i] for i in path] + [nxt]


def check_conditionals(p, records, min_count=1000):
    """records: (path, emitted tokens) per draw. Checks the first token against p[0] and, for every
    accepted node i with enough draws, the token after it against p[i+1]. Returns how many
    conditionals were checked (so a test can insist on depth)."""
    groups = {0: [out[0] for _, out in records]}
    for path, out in records:
        for d, i in enumerate(path):
            groups.setdefault(i + 1, []).append(out[d + 1])
    checked = {r: np.bincount(v, minlength=V) for r, v in groups.items() if len(v) >= min_count}
    z = NormalDist().inv_cdf(1 - 1e-6 / (2 * V * len(checked)))
    for r, counts in checked.items():
        n = counts.sum()
        emp, want = counts / n, p[r]
        bound = z * np.sqrt(want * (1 - want) / n) + 1.0 / n
        bad = np.abs(emp - want) > bound
        assert not bad.any(), f"row {r} ({n} draws): empirical {emp.round(4)} vs target {want.round(4)}"
    return checked


def test_deterministic_candidates_are_lossless_at_every_depth():
    rng = np.random.default_rng(1)
    p = softmax_rows(rng, len(PARENTS) + 1)
    tokens = [int(np.argsort(p[par + 1])[-1 - rank]) for par, rank in zip(PARENTS, RANKS)]  # likely ones
    tokens[2] = tokens[0]  # a repeated sibling can never be accepted twice
    records = []
    for u in rng.random((DRAWS, len(PARENTS) + 1)):
        path, nxt = verify_tree_with_uniforms(p, tokens, PARENTS, None, u)
        records.append((path, outputs(path, nxt, tokens)))
    checked = check_conditionals(p, records)
    assert {1, 4, 6} <= set(checked), f"too few draws reached depth 3: {sorted(checked)}"
    assert not any(path[:1] == [2] for path, _ in records), "a duplicate sibling was accepted"


def test_siblings_sampled_from_q_are_lossless_at_every_depth():
    rng = np.random.default_rng(2)
    p = softmax_rows(rng, len(PARENTS) + 1)
    # Siblings share their parent's q row; q rows lean towards the target (a decent drafter).
    q_of_parent = 0.5 * softmax_rows(rng, len(PARENTS) + 1) + 0.5 * p
    q = np.stack([q_of_parent[par + 1] for par in PARENTS])
    cdf = np.cumsum(q, axis=1)
    records = []
    for u in rng.random((DRAWS, 2 * len(PARENTS) + 1)):
        draws = u[len(PARENTS) + 1:]  # siblings drawn independently from their shared q row
        tokens = [min(int(np.searchsorted(cdf[i], draws[i] * cdf[i, -1], side="right")), V - 1) for i in range(len(PARENTS))]
        path, nxt = verify_tree_with_uniforms(p, tokens, PARENTS, q, u[: len(PARENTS) + 1])
        records.append((path, outputs(path, nxt, tokens)))
    checked = check_conditionals(p, records)
    assert {1, 4} <= set(checked), f"too few draws reached depth 2: {sorted(checked)}"


def test_verify_tree_draws_from_its_key():
    # The public entry point (MLX keys, mx inputs): fewer draws, each costs a device call.
    rng = np.random.default_rng(6)
    p = softmax_rows(rng, len(PARENTS) + 1)
    tokens = [int(np.argmax(p[par + 1])) for par in PARENTS]
    keys = mx.random.split(mx.random.key(2), 3000)
    records = []
    for k in keys:
        path, nxt = verify_tree(mx.array(p, dtype=mx.float32), mx.array(tokens), PARENTS, key=k)
        records.append((path, outputs(path, nxt, tokens)))
    assert 0 in check_conditionals(p, records, min_count=500)
    again = [verify_tree(p, tokens, PARENTS, key=k) for k in keys[:20]]
    assert again == [(path, out[-1]) for path, out in records[:20]], "the same key must give the same round"


def test_walk_with_sampled_rows_is_lossless():
    rng = np.random.default_rng(3)
    p = softmax_rows(rng, len(PARENTS) + 1)
    tokens = [int(np.argmax(p[par + 1])) for par in PARENTS]
    tokens[1] = int(np.argsort(p[0])[-2])
    cdf = np.cumsum(p, axis=1)
    records = []
    for _ in range(DRAWS):
        rows = [int(np.searchsorted(cdf[r], rng.random() * cdf[r, -1], side="right")) for r in range(len(p))]
        path, nxt = walk_tree(rows, tokens, PARENTS)
        records.append((path, outputs(path, nxt, tokens)))
    checked = check_conditionals(p, records)
    assert {1, 4} <= set(checked)


def test_greedy_is_the_longest_matching_path():
    rng = np.random.default_rng(4)
    p = softmax_rows(rng, len(PARENTS) + 1)
    best = p.argmax(1)
    # The target's argmax runs down 1 -> 6 (node 6 matches row 2), not down the first branch.
    tokens = [int((best[0] + 1) % V), int(best[0]), int(best[0]), 0, 0, 0, int(best[2])]
    onehot = np.eye(V)[best]
    path, nxt = verify_tree(onehot, tokens, PARENTS, key=mx.random.key(0))
    assert (path, nxt) == ([1, 6], int(best[7]))
    assert walk_tree(best.tolist(), tokens, PARENTS) == ([1, 6], int(best[7]))


def test_a_chain_is_the_one_branch_tree():
    rng = np.random.default_rng(5)
    p = softmax_rows(rng, 4)
    best = p.argmax(1)
    tokens = [int(best[0]), int(best[1]), int((best[2] + 1) % V)]
    path, nxt = verify_tree(np.eye(V)[best], tokens, [-1, 0, 1], key=mx.random.key(0))
    assert (path, nxt) == ([0, 1], int(best[2]))


def test_mx_inputs_and_bad_shapes():
    p = mx.softmax(mx.random.normal((3, V), key=mx.random.key(0)), axis=-1)
    path, nxt = verify_tree(p, mx.array([1, 2]), mx.array([-1, 0]), key=mx.random.key(1))
    assert isinstance(path, list) and all(isinstance(i, int) for i in path) and isinstance(nxt, int)
    with pytest.raises(InvalidArgumentError, match="parents"):
        verify_tree(p, [1, 2], [-1, 1])
    with pytest.raises(InvalidArgumentError, match=r"\(N\+1, V\)"):
        verify_tree(p, [1], [-1])


def test_a_node_the_target_gives_no_mass_is_rejected_whatever_the_uniform():
    """p(x) = 0 at a node: rejected even at u = 0 (deterministic candidates and q alike); the
    next token comes from the rest of the row."""
    p = np.array([[0.0, 0.7, 0.3, 0.0, 0.0, 0.0]] + [[1 / V] * V] * 2)
    q = np.zeros((2, V))
    q[0, 0] = q[1, 3] = 1.0
    for rows in (None, q):
        path, nxt = verify_tree_with_uniforms(p, [0, 3], [-1, -1], rows, [0.0, 0.0, 0.5])
        assert path == [] and nxt == 1


def test_a_rejection_with_no_residual_mass_keeps_the_row():
    """r == q at a rejected node leaves max(r - q, 0) = 0: the next sibling is tried, and the
    token drawn, against r itself."""
    row = np.array([0.25, 0.75, 0.0, 0.0, 0.0, 0.0])
    p = np.array([row, [1 / V] * V])
    path, nxt = verify_tree_with_uniforms(p, [1], [-1], row[None], [1.0, 0.1])
    assert path == [] and nxt == 0
    path, nxt = verify_tree_with_uniforms(p, [1], [-1], row[None], [1.0, 0.9])
    assert path == [] and nxt == 1


def test_a_draw_never_lands_on_a_token_of_no_weight():
    """u close to 1 with a trailing zero-weight tail: the last token with weight (rounding of the
    cumulative sum must not carry it past)."""
    from mlxspec.verify import _draw

    w = np.array([0.1, 0.2, 0.7, 0.0, 0.0])
    assert all(_draw(w, u) == 2 for u in (0.95, 1.0 - 1e-12, 1.0))


def test_q_of_the_wrong_shape_is_refused():
    p = np.full((3, V), 1 / V)
    with pytest.raises(InvalidArgumentError, match=r"q must have shape \(N, V\) = \(2, 6\)"):
        verify_tree(p, [1, 2], [-1, 0], q=np.full((2, V - 1), 1 / (V - 1)))
