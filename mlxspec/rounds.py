"""One target pass of the loop: what it feeds, what it decides on the device, and its one read.

A pass feeds the last committed token plus k drafts (k = 0: a plain step) and leaves a
few small arrays to read in one wait: the target's token for every fed row (greedy argmax
or a position-keyed sample) and a finiteness flag; the drafts too when they were still
on the device. The host then keeps the drafts that agree with the rows, a loop over at
most 16 ints that is cheaper than the device ops it replaces. A plain step also exposes its
next token as a lazy array, so the next step can be enqueued before this one is read: that
is the pipelining `generate_step` does, and it hides the host's work.

Randomness is position-keyed (`sampling.race`): row i of a pass samples the token at
absolute position `out_pos + i`. Every draft is a function of the history and the seed (a
model drafter races its q with the target's noise), so drafts are checked by sampling the
target's rows and comparing, which is lossless and gives plain decoding's own tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import mlx.core as mx

from . import kernels, mirostat
from .drafters import Draft
from .grammar import masked
from .logprobs import read_rows, row_logprobs
from .sampling import SamplingParams, position_keys, sample_race, xtc_fires
from .verify import walk_tree


@dataclass
class Pass:
    start: int  # position in the target's tokens of the first fed token
    fed: int  # tokens fed: 1 + k
    k: int  # drafts verified
    out: tuple  # lazy results: (tokens, finite[, drafts]) -- see `read`
    token: Optional[mx.array]  # plain step: the lazy next token (1,), the input of a pipelined successor
    drafts: Optional[List[int]]  # drafts known on the host (None: read them from `out`)
    kind: str = ""  # the proposal's kind (acceptance is estimated per kind)
    pipelined: bool = False  # enqueued before its predecessor was read
    shadow: Optional[tuple] = None  # (token, kind): a proposal's guess of this pass's first output token
    parents: Optional[List[int]] = None  # a tree round: the drafts' parents (see mlxspec.tree); None = a chain
    path: Optional[List[int]] = None  # a tree round, once read: the accepted nodes root-to-leaf
    drafted: Optional[int] = None  # a model drafter's steps, when fewer than k (a tree's side leaves)
    read_first: bool = False  # its drafts were read on the host before the pass (a model drafter's read tree)
    static: bool = False  # a model drafter's fixed-shape tree (`sidetree.static_parents`), drafted on the device
    retime: bool = False  # a round that re-times the drafter's costs (`CostModel._explore`)
    forced: bool = False  # its drafts are a grammar's forced tokens (`mlxspec.grammar`), not the drafter's
    src: str = ""  # the drafter whose pass this is (the loop sets it: a model drafter's lookup companion, or itself)
    lp: Optional[tuple] = None  # lazy `logprobs.row_logprobs` of every row, when asked for
    logprobs: Optional[list] = None  # once read: each committed token's (logprob, top choices)
    mu: Optional[mx.array] = None  # mirostat: the threshold after each row's token, lazy (S,) (`mlxspec.mirostat`)


@mx.compile
def _argmax_checked(logits: mx.array):
    """(1, S, V) logits -> (argmax of every row (S,) uint32, all chosen logits finite (1,)).

    argmax lands on a NaN or +inf if a row has one, so checking the chosen logits is the
    finiteness check; compiled into one call because every op costs host time per round.
    """
    rows = logits[0]
    t = mx.argmax(rows, axis=-1)
    return t, mx.all(mx.isfinite(mx.take_along_axis(rows, t[:, None], axis=-1)), keepdims=True)[0]


def _finite(rows: mx.array) -> mx.array:
    # NaN or inf anywhere makes the sum non-finite: one reduction instead of an all(isfinite).
    # float16 sums in float32: a vocabulary of ordinary logits adds up past float16's 65504.
    if rows.dtype == mx.float16:
        rows = rows.astype(mx.float32)
    return mx.isfinite(mx.sum(rows, keepdims=True))[0]


def _constrained(logits: mx.array, mask: Optional[mx.array], bias=None) -> mx.array:
    """(1, S, V) logits with a request's logit_bias added (`sampling.bias_row`) or its penalties
    applied (a function of the logits, `mlxspec.penalties`), and what a grammar refuses at each
    row set to -inf (`mlxspec.grammar`)."""
    if bias is not None:
        logits = bias(logits) if callable(bias) else logits + bias
    return logits if mask is None else masked(logits[0], mask)[None]


def _sample(rows: mx.array, params: SamplingParams, seed: int, positions, mu: Optional[mx.array] = None, drafts=()):
    """A pass's sampled tokens: rows (S, V) of (constrained) logits at absolute `positions`, a chain's
    `drafts` after its first row. Returns (tokens (S,), the rows they were drawn from, mirostat's
    thresholds after each row or None)."""
    keys = position_keys(seed, positions)
    if mu is not None:
        return mirostat.sample(kernels.probabilities(rows, params), mu, drafts, keys, params)
    p = kernels.probabilities(rows, params, xtc_fires(params, keys))
    return sample_race(p, keys), p, None


def _scored(logits: mx.array, p: Optional[mx.array], tokens: mx.array, logprobs: Optional[int], processed: bool):
    """`logprobs.row_logprobs` of a pass's rows (lazy; None when not asked for): of the raw logits,
    or with `processed` of the rows the tokens were drawn from, `p` (greedy, None: the one-hot of
    the chosen token, which had all the mass)."""
    if logprobs is None:
        return None
    if not processed:
        return row_logprobs(logits[0], tokens, logprobs)
    if p is None:
        cols = mx.arange(logits.shape[-1])
        return row_logprobs(mx.where(cols == tokens.astype(mx.int32)[:, None], 0.0, -mx.inf), tokens, logprobs)
    return row_logprobs(mx.log(p), tokens, logprobs)  # (log-softmax of log p is log p)


def plain_step(target, token, params: SamplingParams, seed: int, out_pos: int,
               logprobs: Optional[int] = None, mask: Optional[mx.array] = None,
               bias: Optional[mx.array] = None, mu: Optional[mx.array] = None, processed: bool = False) -> Pass:
    """Feed one token (an int, or the lazy output of the previous step) and pick the next.
    `logprobs` (here and in the other rounds): also the log-probabilities of the picked tokens
    and that many top choices (`mlxspec.logprobs`); None: not computed. `mask` (here and in
    `verify_round`): the tokens a grammar allows at each row, (S, V) bool (`mlxspec.grammar`).
    `bias` (in every round): the request's logit_bias row, added to every row, or a function of
    the logits that applies it and the penalties (`mlxspec.penalties`). `mu` (here and in
    `verify_round`): mirostat's threshold before the first row, lazy (None: no mirostat).
    `processed` (in every round): the logprobs are of the distribution each token was drawn from
    (llama.cpp's post_sampling_probs), not of the raw logits."""
    start = len(target.tokens)
    logits = target.forward(token if isinstance(token, mx.array) else [token], batched=True)
    mu_after = p = None
    if params.greedy:
        nxt, ok = _argmax_checked(_constrained(logits, mask, bias))
    else:
        nxt, p, mu_after = _sample(_constrained(logits, mask, bias)[0, -1:], params, seed, [out_pos], mu)
        nxt, ok = nxt.astype(mx.uint32), _finite(logits[0, -1])
    lp = _scored(logits, p, nxt, logprobs, processed)
    mx.async_eval(nxt, ok, *(lp or ()), *([] if mu_after is None else [mu_after]))
    return Pass(start, 1, 0, (nxt, ok), nxt, [], lp=lp, mu=mu_after)


def verify_round(target, last: int, draft: Draft, params: SamplingParams, seed: int, out_pos: int,
                 logprobs: Optional[int] = None, mask: Optional[mx.array] = None,
                 bias: Optional[mx.array] = None, mu: Optional[mx.array] = None, processed: bool = False) -> Pass:
    """Feed [last] + drafts and pick the target's tokens for every row; the host compares the rows
    with the drafts after the read."""
    start = len(target.tokens)
    k = len(draft)
    on_host = isinstance(draft.tokens, list)
    feed = [last, *draft.tokens] if on_host else mx.concatenate([mx.array([last], mx.uint32),
                                                                 draft.tokens.astype(mx.uint32)])
    logits = target.forward(feed, batched=True)  # (1, k+1, V)
    mu_after = p = None
    if params.greedy:
        tokens, ok = _argmax_checked(_constrained(logits, mask, bias))
    else:
        tokens, p, mu_after = _sample(_constrained(logits, mask, bias)[0], params, seed,
                                      mx.arange(out_pos, out_pos + k + 1), mu, draft.tokens)
        ok = _finite(logits[0])
    out = (tokens, ok) if on_host else (tokens, ok, draft.tokens)
    lp = _scored(logits, p, tokens, logprobs, processed)
    mx.async_eval(*out, *(lp or ()), *([] if mu_after is None else [mu_after]))
    return Pass(start, k + 1, k, out, None, list(draft.tokens) if on_host else None, draft.kind, lp=lp,
                mu=mu_after)


def tree_round(target, last: int, draft: Draft, params: SamplingParams, seed: int, out_pos: int,
               logprobs: Optional[int] = None, bias: Optional[mx.array] = None, processed: bool = False) -> Pass:
    """Feed [last] + a tree of deterministic drafts in one pass (mlxspec.tree) and pick the
    target's token for every row; the host walks the tree along them after the read.

    A sampled row uses the uniform of its position, out_pos + its depth: the walk meets each
    position once, so the tokens are plain decoding's own (see `mlxspec.verify.walk_tree`)."""
    from .tree import depths

    start = len(target.tokens)
    on_host = isinstance(draft.tokens, list)  # else a fixed-shape tree still on the device (read with the pass)
    feed = [last, *draft.tokens] if on_host else mx.concatenate([mx.array([last], mx.uint32),
                                                                 draft.tokens.astype(mx.uint32)])
    logits = target.forward_tree(feed, draft.parents)  # (1, 1+N, V)
    p = None
    if params.greedy:
        tokens, ok = _argmax_checked(_constrained(logits, None, bias))
    else:  # (no mirostat: its rounds draft chains)
        tokens, p, _ = _sample(_constrained(logits, None, bias)[0], params, seed,
                               (out_pos + depths(draft.parents)).tolist())
        ok = _finite(logits[0])
    out = (tokens, ok) if on_host else (tokens, ok, draft.tokens)
    lp = _scored(logits, p, tokens, logprobs, processed)
    mx.async_eval(*out, *(lp or ()))
    return Pass(start, len(draft) + 1, len(draft), out, None, list(draft.tokens) if on_host else None, draft.kind,
                parents=list(draft.parents), lp=lp)


def read(p: Pass):
    """(tokens the pass commits, accepted drafts, all finite, drafts) from one wait on the device;
    a tree round also sets `p.path`, and a pass asked for them `p.logprobs`."""
    first = p.out[0].tolist()
    finite = p.out[1].item()
    if p.k == 0:
        p.logprobs = read_rows(p.lp, [0])
        return first, 0, finite, []
    drafts = p.drafts if p.drafts is not None else p.out[2].tolist()
    if p.parents is not None:  # a tree: follow the target's tokens through it
        p.path, nxt = walk_tree(first, drafts, p.parents)
        p.logprobs = read_rows(p.lp, [0] + [1 + i for i in p.path])  # the rows that chose the committed tokens
        return [drafts[i] for i in p.path] + [nxt], len(p.path), finite, drafts
    n = 0  # the target's token for every row: drafts stand while they agree with it
    while n < p.k and drafts[n] == first[n]:
        n += 1
    nxt = first[n]
    p.logprobs = read_rows(p.lp, list(range(n + 1)))
    return drafts[:n] + [nxt], n, finite, drafts
