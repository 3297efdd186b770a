"""The one generation loop, for plain and speculative decoding alike.

Each iteration reads one pass (one host read), commits its tokens, enqueues the next pass,
and only then does the work that can wait (detokenising, stop strings, events, stats):
the device computes while the host does it. Plain steps go further, as mlx-lm's
`generate_step` does: the next step is enqueued with the current step's token still on
the device, before that token is read.

Whether the next pass may be such a pipelined plain step is decided from what the host
already knows, one token behind: a model drafter asks its cost model; a free drafter
(n-gram) looks up a proposal on the history so far, whose first token is its guess of the
token in flight. If drafting would pay, the loop reads first and drafts on the exact
history (the one bubble a verify round cannot avoid); if not, the guess is checked when
the token arrives, a free acceptance probe.

A model drafter (a draft model, a feature head) has a free companion, prompt lookup (the
n-gram drafter): where the text repeats itself (code edits, quotes, lists) a lookup drafts
better than a small model and costs no drafting. Each round both are judged by their own
cost models and the faster expected one drafts; each pass then teaches its own drafter's
model. Which one drafts depends only on the history and past rounds, so greedy output and
the sampled distribution stay the target's.

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
from .errors import CacheRollbackError, NumericalError, StreamOvertakenError
from .logprobs import PromptScorer
from .prompts import MAX_DRAFT
from . import treeplan
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
             prompt_logprobs: Optional[int] = None, include_stop: bool = False) -> Iterator[TokenEvent]:
    """`tree`: most nodes of a draft tree (0: chains only). `lookup`: a model drafter's rounds
    may draft by prompt lookup instead where that is expected to be faster. `cancel` (an object
    with `is_set()`, e.g. a threading.Event, set from any thread): the generation ends as if
    its stream were closed, between two chunks of the prompt or after the next event.
    `logprobs`: each event also carries its token's log-probability and that many top choices.
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
    ends with the stop string found, not before it."""
    target = engine.target
    drafter, cost = engine.drafters[name], engine.costs[name]
    eos = set(getattr(engine.tokenizer, "eos_token_ids", None) or []) if engine.tokenizer is not None else set()
    asked_ids = set(stop_ids) - (set() if ignore_eos else eos)  # named as the stop_reason when they end it
    eos = (set() if ignore_eos else eos) | set(stop_ids)  # what ends the answer
    ban = None  # min_tokens: the ending tokens' row of -inf
    if min_tokens and eos:
        ban = mx.zeros((engine.vocab_size,), dtype=mx.float32).at[mx.array(sorted(eos))].add(-mx.inf)
    text = TextAssembler(engine.tokenizer, stop, include_stop)
    seed = draw_seed() if seed is None else seed
    context = engine.context
    coord = engine.coord
    dist = coord.active
    read_pass = coord.watched(read)
    # Not with several ranks: each rank's cost models would pick differently.
    companion = LOOKUP if lookup and drafter.uses_model and k_fixed is None and not dist else None
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
    cancelled = (not coord.watched(target.prefill)(todo[:-1], stop=stopping, rows=scorer and scorer.rows)
                 or bool(stopping and stopping()))
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
    cost.guess_probes = params.greedy  # a greedy probe is a guess checked for free (`probe_instead`)

    hist = list(ids)
    longest = longest_draft(engine)  # most drafts a round the cost model sizes may verify
    tree = min(tree, longest) if constraint is None and penalties is None else 0  # most nodes a tree round verifies
    # A model drafter's tree: its chain plus runners-up (`drafters.sidetree`). Fixed-shape trees at
    # any temperature (sampled: its race's winners, each step's runner-up beside them,
    # `sampling.sample_race_two`); trees whose leaves are picked by probability, greedy only.
    trees_from_model = bool(tree) and drafter.uses_model and k_fixed is None
    model_trees = trees_from_model and params.greedy and hasattr(drafter, "propose_tree")
    static_trees = trees_from_model and STATIC_TREES and hasattr(drafter, "propose_static_tree")
    committed = 0  # tokens generated and committed (emitted or about to be)
    talking = dist  # other ranks run this request: an end they cannot see coming must be told
    checked = [0, 0]  # (hash of hist[:upto], upto): every rank's history is compared at each decision

    def room() -> int:
        r = max_tokens - committed
        return r if context is None else min(r, context - len(hist))

    def before_switch(first: int) -> int:
        """Drafts a round that feeds from position `first` may carry without crossing the point
        where the target's KV cache turns quantized (`mlxspec.kvquant`): a tree's rows, unlike a
        chain's, cannot be fed as two passes there."""
        r = target.pass_room(first)
        return MAX_DRAFT if r is None else r - 1

    def decide_early():
        """Before reading a plain step: (chain a plain step?, guess of its token, a model drafter's k).

        Judged on the chain alone (a tree adds branches to it): when the chain would not pay, a
        tree on a device where it could is not tried either, which keeps this early call cheap.
        A guess is (token, kind, the drafter that made it)."""
        if name == "none" or k_fixed == 0:
            return True, None, None
        if k_fixed is not None:
            return False, None, None
        k_cap = min(room() - 2, longest, before_switch(len(hist)))  # the round after the pending step
        src, probe = name, None
        if drafter.uses_model:
            k, probe = probe_instead(cost.choose(k_cap))
            if k or companion is None:
                return k == 0, probe, k
            src = companion  # the model would not draft: would a lookup?
        proposal = engine.drafters[src].propose(hist, k_cap + 1, params, seed)
        model_k = 0 if src != name else None
        if not len(proposal):
            return True, probe, model_k
        k = engine.costs[src].choose(len(proposal) - 1, kind=proposal.kind) if len(proposal) > 1 else 0
        return k == 0, probe or ((proposal.tokens[0], proposal.kind, src) if k == 0 else None), model_k

    def probe_instead(k: int) -> tuple:
        """(k, guess) for a model drafter's chosen k. When the cost model only wants a probe and
        decoding is greedy, the probe verifies nothing: the drafter's first token is a guess of
        the token the next pass gives, checked when that arrives (what a k = 1 round would
        learn, for one drafting step), and k becomes 0. Sampled rounds keep k = 1 probes. A
        sampled guess would be as informative (the drafter's race winner is the target's sample
        exactly when a k = 1 round would accept it, `sampling.race`), but measured slower: on a
        CPU at T = 0.7, three bench runs each way, the draft model made 0.92-0.96x plain decoding
        with guesses against 0.96-1.03x with k = 1 probes, which keep a token when they hold."""
        if not (k and cost.probing and params.greedy):
            return k, None
        d = drafter.propose(hist, 1, params, seed)
        return (0, (d.tokens[0], "", name)) if len(d) else (k, None)

    def free_plan(src: str, k_cap: int) -> tuple:
        """A free drafter's next pass on the exact history: a chain cut to what pays (the whole
        proposal travels with k: with several ranks, rank 0's k may be longer) or, with trees
        on, a tree pruned to what pays; its first token is the shadow guess when nothing is
        drafted (a free acceptance probe)."""
        d, c = engine.drafters[src], engine.costs[src]
        if tree and hasattr(d, "propose_tree"):  # (never with several ranks: see Engine.stream)
            proposal = d.propose_tree(hist, k_cap, k_cap + tree, params, seed)
            draft = treeplan.plan(proposal, c, tree)
            k = len(draft)
        else:
            draft = proposal = d.propose(hist, k_cap, params, seed)
            k = c.choose(len(proposal), kind=proposal.kind) if len(proposal) else 0
        shadow = (proposal.tokens[0], proposal.kind, src) if len(proposal) and not k else None
        return k, draft, shadow, src

    def plan(model_k: Optional[int] = None) -> tuple:
        """(k, draft or None, shadow, source drafter) of the next pass, decided on the exact
        committed history. k is the draft's length (a tree's node count); a model drafter's
        draft is made when the pass is enqueued (None here); `model_k`: its k, already chosen."""
        k_cap = min(room() - 1, MAX_DRAFT, before_switch(len(hist) - 1))
        if name == "none" or k_cap <= 0:
            return 0, None, None, name
        if k_fixed is not None:
            return min(k_fixed, k_cap), None, None, name
        k_cap = min(k_cap, longest)
        if k_cap <= 0:
            return 0, None, None, name
        if not drafter.uses_model:
            return free_plan(name, k_cap)
        if model_k is not None:  # decided before the last read (`decide_early`)
            k, guess = min(model_k, k_cap), None
        else:
            k, guess = probe_instead(cost.choose(k_cap))
        if companion is None:
            return k, None, guess, name
        free = free_plan(companion, k_cap)
        # A round that re-times the model's costs (`CostModel._explore`) is not given away: on a GPU
        # lookup drafts nearly every round (two free drafts cost what one does there), and a stale
        # draft cost would never be re-timed (an H100's head drafted one round in six prompts).
        if free[0] and (not k or (not cost.exploring and free_speed(free) > (cost.speed(k) or 0.0))):
            return free
        # Its first token still teaches the lookup's model beside the model's round (a free
        # probe): a companion that stopped learning once it lost could never win again.
        probe = guess or free[2] or ((free[1].tokens[0], free[1].kind, companion) if free[0] else None)
        return k, None, probe, name

    def free_speed(step: tuple) -> float:
        """Expected tokens per second of a free drafter's planned pass (0 when unknown)."""
        k, draft, _, src = step
        c = engine.costs[src]
        if draft.parents is None:
            return c.speed(k, draft.kind) or 0.0
        v = c.curve.verify_seconds(k + 1)
        return (1.0 + sum(treeplan.reach(draft, c))) / v if v else 0.0

    def agree(step: tuple) -> Optional[tuple]:
        """Rank 0's step on every rank, or None when rank 0 has ended the request."""
        nonlocal talking
        checked[:] = history_hash(hist[checked[1]:], checked[0]), len(hist)
        stop, k = coord.decide([0, step[0]], check=checked[0])
        if stop:
            talking = False
            return None
        return (k, *step[1:])

    def enqueue(step: tuple) -> Pass:
        k, draft, shadow, src = step
        drafted, read_first, static = None, False, False
        if draft is None and k and (model_trees or static_trees) and not cost.exploring:
            # The chain plus runners-up as side leaves, where their rows pay. First the
            # fixed-shape tree, drafted and verified on the device like a chain; else (greedy) the
            # tree whose leaves are picked by probability, which the host must read first. Not for a
            # round that re-times a pass length (`CostModel._explore`): side leaves would make its
            # pass longer than the one it is to time, which would stay warm-up's guess.
            m = treeplan.static_leaves(cost, k, tree) if static_trees else 0
            if m:
                draft, drafted, static = drafter.propose_static_tree(hist, k, m, params, seed), k, True
            elif model_trees and treeplan.could_widen(cost, k, tree):
                proposal = drafter.propose_tree(hist, k, k + tree, params, seed)
                draft, drafted, read_first = treeplan.widen(proposal, cost, tree), k, True
        if draft is None:  # a model (or a fixed k) drafts the same tokens on every rank: same history, same seed
            draft = drafter.propose(hist, k, params, seed) if k else Draft([])
        elif draft.parents is None and len(draft) != k:  # a chain proposal, cut to (rank 0's) k
            draft = Draft(draft.tokens[:k], kind=draft.kind)
        mask, forced = None, False
        if constraint is not None:
            draft, mask, forced = constrain(draft)
        if penalties is not None and not isinstance(draft.tokens, list):
            draft = Draft(draft.tokens.tolist(), kind=draft.kind)
        row_bias = shaping(draft)
        if not len(draft):
            p = plain_step(target, hist[-1], params, seed, len(hist), logprobs, mask, row_bias)
        elif draft.parents is not None:
            p = tree_round(target, hist[-1], draft, params, seed, len(hist), logprobs, row_bias)
        else:
            p = verify_round(target, hist[-1], draft, params, seed, len(hist), logprobs, mask, row_bias)
        p.shadow, p.drafted, p.src, p.read_first, p.static = shadow, drafted, src, read_first, static
        p.retime = src == name and bool(k) and cost.exploring
        p.forced = forced
        return p

    def shaping(draft: Draft, pending: Optional[mx.array] = None):
        """What a pass adds to its logits before the target's choice: the request's logit_bias,
        min_tokens' ban on the rows that come before it, and the penalties (`rounds` takes an
        array to add, or a function of the logits). `pending`: a chained step's predecessor."""
        added = bias
        early = min_tokens - (len(hist) - len(ids)) - (pending is not None)  # rows still before min_tokens
        if ban is not None and early > 0:
            rows = mx.arange(len(draft) + 1)[:, None] < early
            added = mx.where(rows, ban, 0.0) + (0.0 if added is None else added)
        if penalties is None:
            return added
        adjust = penalties.rows(hist, draft.tokens, pending)  # (a list: the pass read its drafts)
        return adjust if added is None else (lambda logits: adjust(logits + added))

    def constrain(draft: Draft) -> tuple:
        """(the draft on the host, its rows' masks, whether it is the grammar's forced tokens).

        A draft is cut before what the grammar refuses (the target, masked, could not sample it);
        when speculating, a draft that does not begin with the tokens the grammar forces next
        becomes them (as many as a pass may verify)."""
        tokens = draft.tokens if isinstance(draft.tokens, list) else draft.tokens.tolist()
        forced = False
        tokens = tokens[:constraint.allowed(tokens)]
        if name != "none" and k_fixed != 0:
            ff = constraint.forced()[:max(0, min(room() - 1, longest))]
            if ff and tokens[:len(ff)] != ff:
                tokens, forced = ff, True
        return Draft(tokens, kind=draft.kind), constraint.rows(tokens), forced

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
    enqueue = coord.watched(enqueue)
    step = agree(plan()) if dist else plan()
    pending: Optional[Pass] = enqueue(step) if step else None

    def release() -> None:
        """End this generation's hold on the engine: at its end, or when a later request overtakes it."""
        nonlocal pending
        engine.generation = None
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
    try:
        while pending is not None:
            nxt = None
            model_k = None
            chained = 0.0
            guess = pending.shadow  # a proposal's guess of the token pending will give
            if pending.k == 0 and room() >= 2 and not dist and constraint is None:
                chain, early_guess, model_k = decide_early()
                guess = early_guess or guess
                if chain:
                    t_chain = clock()
                    nxt = plain_step(target, pending.token, params, seed, len(hist) + 1, logprobs,
                                     bias=shaping(Draft([]), pending.token))
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
            committed += len(new)
            if constraint is not None:
                constraint.commit(new)
            if penalties is not None:
                penalties.commit(new)
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
                pending = nxt if nxt is not None else enqueue(step if dist else plan(model_k))

            # The work that can wait, while the device computes the next pass.
            for i, tok in enumerate(new):
                stats.tokens += 1
                last = i == len(new) - 1
                why = None  # the stop string or stop token id that ended it
                if tok in eos:
                    piece, end = text.add(None)[0] + text.flush(), "stop"
                    why = tok if tok in asked_ids else None
                else:
                    piece, stopped = text.add(tok)
                    end = "stop" if stopped else None
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
                lp, top = done.logprobs[i] if done.logprobs is not None else (None, None)
                yield TokenEvent(tok, piece, i < n, stats.rounds - 1, done.k, stats, end, lp, top,
                                 scorer.read() if scorer is not None and stats.tokens == 1 else None, why)
                if end or (cancel is not None and cancel.is_set()):  # complete, even if the consumer
                    return  # started the next request on this last event; or cancelled: as if closed
                if engine.generation is not release:
                    raise StreamOvertakenError(OVERTAKEN)
                t_resume = clock()
                consumer += t_resume - t_yield
    finally:
        if engine.generation is release:  # not if overtaken: the engine has a new owner
            release()
