"""The one generation loop, for plain and speculative decoding alike.

Each iteration reads one pass (one host read), commits its tokens, enqueues the next pass,
and only then does the work that can wait (detokenising, stop strings, events, stats):
the device computes while the host does it. Plain steps go further, as mlx-lm's
`generate_step` does: the next step is enqueued with the current step's token still on
the device, before that token is read.

What the next pass is (plain, a chain or a tree, and which drafter drafts it) is decided by
`mlxspec.planner`, on what the host knows; this loop enqueues it, reads it, commits its tokens
and teaches the cost models what it cost.

A pass that the end of generation makes useless (EOS, a stop string, a closed stream) is
rolled back from the caches, which therefore always hold exactly the committed tokens
between requests.

With the target sharded over several ranks (`engine.coord.active`), rank 0 decides for all
after every read (`agree`, one small collective, see `mlxspec.distributed`): the next
draft's length, or that it has ended the request (a stop string, a closed stream), which
the other ranks then undo their last pass to match. The decision must wait for no pass in
flight, so plain steps are not chained there.
"""

from __future__ import annotations

import time
from typing import Iterator, List, Optional

import mlx.core as mx

from .device import clear_streams_at_thread_exit
from .distributed import history_hash
from .drafters import Draft
from .errors import CacheRollbackError, InvalidArgumentError, NumericalError, StreamOvertakenError
from .logprobs import PromptScorer
from .mirostat import initial_mu
from . import treeplan
from .planner import Planner
from .prediction import prediction_counts
from .rounds import Pass, plain_step, read, tree_round, verify_round
from .sampling import SamplingParams
from .stats import GenerationStats, TokenEvent
from .text import TextAssembler
from .warmup import longest_draft

LOOKUP = "ngram"  # a model drafter's free companion
# A model drafter's fixed-shape trees (`treeplan.static_leaves`) before its read ones; False keeps
# read trees only (for side-by-side measurements).
STATIC_TREES = True
OVERTAKEN = ("this stream was overtaken: the engine ran another request (or was reset) before it finished, "
             "and an engine runs one generation at a time; finish or close a stream before the next request, "
             "or give each its own engine (engine.fork())")


def draw_seed() -> int:
    """A seed from MLX's global random state (so `mx.random.seed` governs unseeded requests)."""
    return int(mx.random.randint(0, 1 << 31, shape=()).item())


def forget_drafts(engine) -> None:
    """Reset the drafters: ranks that ended a request at different points fed them differently,
    and drafts must stay identical on every rank."""
    for d in engine.drafters.values():
        d.reset()


def generate(engine, ids: List[int], params: SamplingParams, **options) -> Iterator[TokenEvent]:
    """Run one request on `engine` (`_generate`, which documents `options`), held by this thread
    while it steps, not while the consumer has an event (`mlxspec.occupancy`): a request from
    another thread meanwhile raises EngineBusyError; one that comes while the stream waits for
    its consumer overtakes it, from whichever thread."""
    clear_streams_at_thread_exit(engine)  # a pool thread that ends: the engine's arrays first, then its streams
    occupancy = engine.occupancy
    occupancy.enter(then=engine.end_open_stream)
    held = True
    inner = _generate(engine, ids, params, **options)
    try:
        for event in inner:
            occupancy.leave()
            held = False
            yield event
            if not occupancy.try_enter():  # another thread's request took the engine meanwhile
                raise StreamOvertakenError(OVERTAKEN)
            held = True
    finally:
        # Closed between events: end it here, unless another thread's request has already ended it.
        if held or occupancy.try_enter():
            try:
                inner.close()
            finally:
                occupancy.leave()


def _generate(engine, ids: List[int], params: SamplingParams, *, max_tokens: int, seed: Optional[int], name: str,
             k_fixed: Optional[int], stop: List[str], stats: GenerationStats, tree: int = 0,
             lookup: bool = False, cancel=None, logprobs: Optional[int] = None,
             constraint=None, bias: Optional[mx.array] = None, penalties=None, stop_ids=(),
             ignore_eos: bool = False, min_tokens: int = 0,
             prompt_logprobs: Optional[int] = None, include_stop: bool = False,
             end_after: str = "", prediction: Optional[List[int]] = None, min_indent: int = 0,
             soft_time_limit: Optional[float] = None, post_sampling: bool = False) -> Iterator[TokenEvent]:
    """`tree`: most nodes of a draft tree (0: chains only). `lookup`: a model drafter's rounds
    may draft by prompt lookup instead where that is expected to be faster. `cancel` (an object
    with `is_set()`, e.g. a threading.Event, set from any thread): the generation ends as if
    its stream were closed, between two chunks of the prompt or after the next event.
    `logprobs`: each event also carries its token's log-probability and that many top choices;
    with `post_sampling`, of the distribution it was drawn from rather than the raw logits.
    `constraint` (`mlxspec.grammar.Constraint`): a grammar every token follows. Each pass's masks
    are computed on the host from the committed tokens, so plain steps are not chained ahead of
    their read, and rounds draft chains (a tree's rows would need one mask per branch). `bias`: the
    request's logit_bias row (`sampling.bias_row`), added to every row of every pass. `penalties`
    (`mlxspec.penalties.Penalties`): presence, frequency and repetition penalties, row by row;
    rounds then draft chains, read on the host. `stop_ids`: more tokens that end the answer as
    EOS does; `ignore_eos`: the model's EOS does not; `min_tokens`: before that many tokens, the
    tokens that would end it are banned (-inf) at every row that comes before. `prompt_logprobs`:
    the first event also carries every prompt token's log-probability and that many top choices,
    from a prefill that computes every row (nothing taken from a cache). `include_stop`: the text
    ends with the stop string found, not before it. `end_after`: text that ends the answer, kept
    in it (a tool call's end marker, when the answer may call one tool only). `prediction`: token ids
    the answer is expected to largely repeat (OpenAI's Predicted Outputs), which lookup drafts
    from (`NgramDrafter.predict`); a model drafter's lookup rounds then run even with `lookup` off.
    `min_indent`, `soft_time_limit`: llama.cpp's n_indent and t_max_predict_ms (`Engine.stream`);
    the answer ends at such a limit with finish_reason "length"."""
    target = engine.target
    drafter, cost = engine.drafters[name], engine.costs[name]
    eos = set(getattr(engine.tokenizer, "eos_token_ids", None) or []) if engine.tokenizer is not None else set()
    asked_ids = set(stop_ids) - (set() if ignore_eos else eos)  # named as the stop_reason when they end it
    eos = (set() if ignore_eos else eos) | set(stop_ids)  # what ends the answer
    ban = None  # min_tokens: the ending tokens' row of -inf
    if min_tokens and eos:
        ban = mx.zeros((engine.vocab_size,), dtype=mx.float32).at[mx.array(sorted(eos))].add(-mx.inf)
    text = TextAssembler(engine.tokenizer, stop, include_stop, end_after, min_indent)
    seed = draw_seed() if seed is None else seed
    coord = engine.coord
    dist = coord.active
    # Time is rank 0's alone: it ends the request as a closed stream would, and tells the others.
    deadline = soft_time_limit if not dist or coord.is_main else None
    read_pass = coord.watched(read, "a target pass's result")
    # Not with several ranks: each rank's cost models would pick differently.
    companion = LOOKUP if (lookup or prediction) and drafter.uses_model and k_fixed is None and not dist else None
    if hasattr(drafter, "copying"):  # its chains copy where the text repeats (`drafters.chaincopy`)
        drafter.copying = lookup
    clock = time.perf_counter
    engine.last_stats = stats
    mx.reset_peak_memory()

    t0 = clock()
    scorer = None
    if prompt_logprobs is None:
        engine.prompt_cache.recall(engine, ids)  # an earlier conversation's caches, if it comes back
    else:  # every prompt row is computed: none may come from a cache (the live ones are parked)
        scorer = PromptScorer(ids, prompt_logprobs)
        engine.prompt_cache.set_aside(engine)
    todo = target.sync(ids)
    # A long prompt can take minutes on a slow device: a cancelled request stops between two of
    # its chunks (not with several ranks, which run each chunk's collectives together).
    stopping = cancel.is_set if cancel is not None and not dist else None
    fed = len(target.tokens)
    prefill = coord.watched(target.prefill, "the prompt's prefill")
    cancelled = not prefill(todo[:-1], stop=stopping, rows=scorer and scorer.rows) or bool(stopping and stopping())
    stats.prefilled_tokens = stats.prompt_timed_tokens = len(target.tokens) - fed
    if not cancelled:
        if hasattr(drafter, "prefill"):
            drafter.prefill(ids)
        stats.prefilled_tokens += 1  # the last prompt token, fed with the first pass
    stats.prompt_seconds = clock() - t0
    if cancelled:  # the caches hold what was fed, consistently: a later request reuses it
        engine.finish_stats(stats, name)
        return
    for c in engine.costs.values():  # a companion's too: each mode has its own acceptance counts
        c.set_greedy(params.greedy)
    cost.new_request()
    cost.guess_probes = params.greedy  # a greedy probe is a guess checked for free (`Planner.probe_instead`)

    hist = list(ids)  # the committed history, extended in place as tokens are committed
    engine.drafters[LOOKUP].predict(prediction, start=len(ids))  # (and forgotten in `release`)
    planner = Planner(engine, ids, hist, params, seed, name=name, k_fixed=k_fixed, tree=tree, companion=companion,
                      longest=longest_draft(engine), max_tokens=max_tokens, constraint=constraint,
                      penalties=penalties, bias=bias, ban=ban, min_tokens=min_tokens, static_trees=STATIC_TREES)
    room, plan = planner.room, planner.plan
    talking = dist  # other ranks run this request: an end they cannot see coming must be told
    checked = [0, 0]  # (hash of hist[:upto], upto): every rank's history is compared at each decision

    def agree(step: tuple) -> Optional[tuple]:
        """Rank 0's step on every rank, or None when rank 0 has ended the request."""
        nonlocal talking
        checked[:] = history_hash(hist[checked[1]:], checked[0]), len(hist)
        stop, k = coord.decide([0, step[0]], check=checked[0])
        if stop:
            talking = False
            return None
        return (k, *step[1:])

    mu = initial_mu(params)  # mirostat's threshold after the committed tokens (None: no mirostat)

    def enqueue(step: tuple) -> Pass:
        """The step's pass, drafted on the exact history and enqueued on the device."""
        k, _, shadow, src = step
        d = planner.draft(step)
        if not len(d.draft):
            p = plain_step(target, hist[-1], params, seed, len(hist), logprobs, d.mask, d.added, mu, post_sampling)
        elif d.draft.parents is not None:
            p = tree_round(target, hist[-1], d.draft, params, seed, len(hist), logprobs, d.added, post_sampling)
        else:
            p = verify_round(target, hist[-1], d.draft, params, seed, len(hist), logprobs, d.mask, d.added, mu,
                             post_sampling)
        p.shadow, p.drafted, p.src, p.read_first, p.static = shadow, d.drafted, src, d.read_first, d.static
        p.retime = src == name and bool(k) and cost.exploring
        p.forced = d.forced
        return p

    consumer = 0.0  # seconds spent outside the generator (the consumer's), excluded from every timing
    t_read, consumer_at_read = clock(), 0.0
    # Seconds spent enqueuing the chained step before the pending one was read: the chained step's
    # cost. (MLX's CPU backend runs one evaluation at a time, so enqueuing a step waits for the
    # pass in flight; without this, a plain round would be timed as two passes and the last
    # chained step before a round as none.)
    carried = 0.0
    t_resume = t_read
    # With several ranks a pass is a collective, and on MLX's CPU backend enqueuing one waits for
    # the pass in flight: watched like a read, so a rank that hangs there cannot hang the others.
    enqueue = coord.watched(enqueue, "a target pass to start")
    step = agree(plan()) if dist else plan()
    pending: Optional[Pass] = enqueue(step) if step else None

    def release() -> None:
        """End this generation's hold on the engine: at its end, or when a later request overtakes it."""
        nonlocal pending
        engine.generation = None
        engine.drafters[LOOKUP].predict(None)
        if pending is not None:  # abandoned mid-round: the in-flight pass never happened
            try:
                target.rollback(pending.fed)
            except CacheRollbackError:  # ending on a failed rollback: start clean, and keep its error the one seen
                target.reset()
                forget_drafts(engine)
            pending = None
        if talking and not coord.broken:  # ended here (stop string, closed stream, error): tell the others
            coord.decide([1, 0])
            forget_drafts(engine)
        engine.finish_stats(stats, name)

    engine.generation = release
    cannot = None  # why no token can follow the committed ones (raised once they are yielded)
    try:
        while pending is not None:
            nxt = None
            model_k = None
            chained = 0.0
            guess = pending.shadow  # a proposal's guess of the token pending will give
            if pending.k == 0 and room() >= 2 and not dist and constraint is None and \
                    (penalties is None or penalties.dry is None):  # (both read the tokens on the host)
                chain, early_guess, model_k = planner.decide_early()
                guess = early_guess or guess
                if chain:
                    t_chain = clock()
                    nxt = plain_step(target, pending.token, params, seed, len(hist) + 1, logprobs,
                                     bias=planner.shaping(Draft([]), pending.token),
                                     mu=None if mu is None else pending.mu[0], processed=post_sampling)
                    nxt.pipelined, nxt.src = True, name
                    chained = clock() - t_chain

            t_wait = clock()
            new, n, finite, drafts = read_pass(pending)
            now = clock()
            stats.wait_seconds += now - t_wait
            if not finite:
                pending = nxt = None
                engine.reset()
                raise NumericalError(
                    "the target produced NaN or infinite logits; generation stopped (the engine's caches "
                    "were cleared and it can serve the next request)")

            # Commit: settle lazily fed tokens, drop rejected drafts, extend the history.
            if pending.drafts is None:
                target.settle(pending.start, [hist[-1], *drafts])
            if pending.parents is not None:
                target.keep_path(pending.start, pending.path)
            else:
                target.rollback(pending.k - n)
            if nxt is not None:
                target.settle(nxt.start, new)
            hist.extend(new)
            if constraint is not None:
                constraint.commit(new)
            if penalties is not None:
                penalties.commit(new)
            if mu is not None:
                mu = pending.mu[n]  # (lazy: the next pass reads it on the device)
            # Read and committed: from here on only the chained plain step (if any) is in flight,
            # which is all `finally` may roll back, whatever ends the request.
            done, pending = pending, nxt

            # Learn: the period between two reads, minus the consumer's time, is what this pass cost;
            # it teaches the cost model of the drafter that made the pass (or the guess).
            period = (now - t_read) - (consumer - consumer_at_read) - chained + carried
            t_read, consumer_at_read, carried = now, consumer, chained
            made = engine.costs[done.src]
            engine.curve.at_context(done.start)  # a pass's cost grows with the keys it reads
            if name == "none" or done.forced:
                pass  # plain decoding decides nothing; the grammar's forced tokens say nothing of the drafter
            elif done.pipelined:
                engine.curve.observe_plain(period)
            elif done.k or not chained:
                # A plain round whose successor was chained before its read is not timed as V(1):
                # on MLX's CPU backend its pass finishes inside that enqueue (which waits for it),
                # so its period came out 10-13 ms short of the 73 ms pass and pulled the plain
                # estimate down with it; the pipelined steps that follow are timed instead.
                made.observe_round(done.k, period, done.drafted, read=done.read_first, static=done.static,
                                   retime=done.retime)
            if done.parents is not None:
                treeplan.observe(made, Draft(drafts, kind=done.kind, parents=done.parents), done.path, done.static)
            elif done.k and not done.forced:
                made.observe_acceptance(done.k, n, done.kind)
            if guess is not None and (not done.k or guess[2] != done.src):
                engine.costs[guess[2]].observe_acceptance(1, float(int(guess[0]) == new[0]), guess[1])
            stats.record_round(done.k, n, tree=done.parents is not None, lookup=done.src != name, forced=done.forced)
            if dist:
                step = agree(plan(model_k))
                if step is None:  # rank 0 ended the request before this pass: undo it as rank 0 did
                    target.rollback(len(new))
                    forget_drafts(engine)
                    return

            # The end, known from the tokens alone: EOS, max_tokens, the context.
            finish = None
            cut = next((i for i, t in enumerate(new) if t in eos), None)
            if cut is not None:
                new, finish = new[: cut + 1], "stop"
            elif room() <= 0:
                finish = "length"
            if finish:
                talking = False  # every rank ends here: the tokens say so
                if nxt is not None:
                    target.rollback(nxt.fed)
                pending = None
            else:
                try:
                    pending = nxt if nxt is not None else enqueue(step if dist else plan(model_k))
                except InvalidArgumentError as e:  # nothing can follow (`Constraint.rows`): said after these
                    pending, cannot = None, e

            # The work that can wait, while the device computes the next pass.
            for i, tok in enumerate(new):
                stats.tokens += 1
                last = i == len(new) - 1
                why = None  # the stop string or stop token id that ended it
                if tok in eos:
                    piece, end = text.add(None)[0] + text.flush(), "stop"
                    why = tok if tok in asked_ids else None
                else:
                    late = deadline is not None and stats.seconds + clock() - t_resume >= deadline
                    piece, stopped = text.add(tok, late)
                    end = ("length" if text.limited else "stop") if stopped else None
                    why = text.matched if stopped else None
                    if finish and last and not end:
                        piece, end = piece + text.flush(), finish
                if end and pending is not None:
                    target.rollback(pending.fed)
                    pending = None
                t_yield = clock()
                stats.seconds += t_yield - t_resume
                if stats.tokens == 1:
                    stats.first_token_seconds = stats.prompt_seconds + stats.seconds
                if end:
                    engine.finish_stats(stats, name)
                    if prediction:  # (after the timings: a diff of the two texts)
                        stats.prediction_accepted, stats.prediction_rejected = prediction_counts(
                            prediction, hist[len(ids):len(ids) + stats.tokens])
                lp, top = done.logprobs[i] if done.logprobs is not None else (None, None)
                yield TokenEvent(tok, piece, i < n, stats.rounds - 1, done.k, stats, end, lp, top,
                                 scorer.read() if scorer is not None and stats.tokens == 1 else None, why)
                if end or (cancel is not None and cancel.is_set()):  # complete, even if the consumer
                    return  # started the next request on this last event; or cancelled: as if closed
                if engine.generation is not release:
                    raise StreamOvertakenError(OVERTAKEN)
                t_resume = clock()
                consumer += t_resume - t_yield
            if cannot is not None:
                raise cannot
    finally:
        if engine.generation is release:  # not if overtaken: the engine has a new owner
            release()
