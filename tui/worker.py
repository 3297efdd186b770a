"""What the generation worker thread does: run one turn, post messages. Never touches widgets."""

from __future__ import annotations

import threading
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, TypeVar

from mlxspec.device import clear_streams
from mlxspec.errors import ContextLengthError
from mlxspec.loop import draw_seed

from .conversation import SIDES, SPEC, VANILLA, Answer, Turn
from .messages import StatsUpdated, TokensAdded, TurnFinished
from .race import race
from .stats_view import StatsView

T = TypeVar("T")
FLUSH_SECONDS = 1 / 20  # post pane updates at most this often (the UI re-renders on each)


@dataclass(frozen=True)
class TurnRequest:
    user: str
    messages: Dict[str, List[dict]]  # per side: the full message list, ending with the user message
    temperature: float = 0.0
    max_tokens: int = 256
    num_draft: Optional[int] = None  # None: the cost model chooses
    drafter: Optional[str] = None  # None: the engine's default
    tree: Optional[object] = None  # None: the engine's
    lookup: Optional[bool] = None  # None: the engine's
    sequential: bool = False
    seed: Optional[int] = None
    template_kwargs: Optional[dict] = None  # the chat template's variables
    forget: bool = False  # turns were taken back: prompt lookup first forgets what this prompt no longer holds


def run_turn(request: TurnRequest, engines: Dict[str, object], cancel: threading.Event,
             post: Callable[[object], object], settle: Optional[Callable[[], object]] = None) -> Turn:
    """Stream both sides, post TokensAdded/StatsUpdated as they go and one TurnFinished at the end.

    `settle()`, when given, returns once the UI has drawn what was posted: the worker calls it
    after each flush, between timed steps, so drawing is never on either side's clock.
    """
    answers = {side: Answer() for side in SIDES}
    pending: Dict[str, list] = {side: [] for side in SIDES}
    latest: Dict[str, object] = {}
    error = None

    def flush():
        posted = bool(latest) or any(pending.values())
        for side in SIDES:
            if pending[side]:
                post(TokensAdded(side, tuple(pending[side])))
                pending[side] = []
        for side, stats in latest.items():
            post(StatsUpdated(side, StatsView.of(stats)))
        latest.clear()
        if posted and settle is not None and not cancel.is_set():
            settle()

    # One seed for both sides (drawn per turn when none was given): every sampled token is a race
    # the seed fixes (`mlxspec.sampling.race`), so the two sides sample the same text and a
    # difference is judged like a greedy one.
    seed = request.seed if request.seed is not None or request.temperature == 0 else draw_seed()
    try:
        if request.forget:  # (here, on the engines' thread)
            engines[SPEC].forget_beyond(request.messages[SPEC], chat_template_kwargs=request.template_kwargs)
        # `cancel` also stops a side in the middle of a long prompt, before its first token (Esc).
        common = dict(max_tokens=request.max_tokens, temperature=request.temperature, seed=seed,
                      chat_template_kwargs=request.template_kwargs, cancel=cancel)
        streams = {
            SPEC: engines[SPEC].stream(request.messages[SPEC], speculative=True, num_draft=request.num_draft,
                                       drafter=request.drafter, tree=request.tree, lookup=request.lookup,
                                       **common),
            VANILLA: engines[VANILLA].stream(request.messages[VANILLA], speculative=False, **common),
        }
        last_flush = [time.perf_counter()]

        def between():  # nothing is timed now: show what came, at most every FLUSH_SECONDS
            if time.perf_counter() - last_flush[0] >= FLUSH_SECONDS:
                flush()
                last_flush[0] = time.perf_counter()

        slices = closing(race(streams, cancel=cancel, sequential=request.sequential, between=between))
        with slices as racing:  # closing: the streams end with it
            for side, events in racing:
                _record(answers[side], pending[side], events)
                latest[side] = events[-1].stats
    except ContextLengthError as e:  # the conversation outgrew the model: say the chat's remedies
        error = (f"the conversation no longer fits the model ({e}). Type /clear to start a new one, or restart "
                 f"the chat with --max-kv-size W (below the context) for a sliding window")
    except Exception as e:  # an engine error ends the turn with a readable line, not a crash
        error = f"{type(e).__name__}: {e}"
    # This thread's streams are freed when it ends, and the next turn runs on another: nothing
    # the engines keep may still be lazy then (a stopped turn can leave its last pass so).
    for engine in {id(e): e for e in engines.values()}.values():
        try:
            engine.materialize()
        except Exception as e:
            error = error or f"{type(e).__name__}: {e}"
            engine.reset()
    flush()
    for a in answers.values():
        a.stats = a.stats if isinstance(a.stats, StatsView) else StatsView.of(a.stats)
    turn = Turn(request.user, answers, temperature=request.temperature, stopped=cancel.is_set(),
                same_history=request.messages[SPEC] == request.messages[VANILLA])
    if turn.same_history and not turn.identical:
        turn.divergence = classify(engines[SPEC], request.messages[SPEC], answers, stopped=turn.stopped,
                                   temperature=turn.temperature, seed=seed)
    post(TurnFinished(turn, error))
    return turn


def classify(engine, messages: List[dict], answers: Dict[str, Answer], *, stopped: bool,
             temperature: float = 0.0, seed: Optional[int] = None) -> Optional[dict]:
    """Classify where two answers part, greedy or sampled with one `seed` (float32 reference pass;
    after the timing). None: they do not.

    A stopped turn compares only as far as both sides got.
    """
    from mlxspec.bench.neartie import check_greedy
    from mlxspec.prompts import encode_prompt

    spec, van = answers[SPEC].tokens, answers[VANILLA].tokens
    if stopped:
        spec, van = spec[: len(van)], van[: len(spec)]
    try:
        ids = encode_prompt(messages, engine.tokenizer, engine.vocab_size)
        check = check_greedy(engine.target_model, ids, van, spec, max_kv_size=engine.max_kv_size,
                             kv_quant=engine.kv_quant, temperature=temperature, seed=seed)
    except Exception as e:  # a check that cannot run says so; it never fails the turn
        return {"divergence": "unclassified", "position": None, "tokens": None, "reason": f"{type(e).__name__}: {e}"}
    if check.identical:
        return None
    reason = check.judgement.reason if check.judgement is not None else "the outputs end differently"
    return {"divergence": check.divergence, "position": check.position, "tokens": len(spec) - check.position,
            "reason": reason}


def _record(a: Answer, pending: list, events) -> None:
    for ev in events:
        a.text += ev.text
        a.tokens.append(ev.token)
        a.from_draft.append(ev.from_draft)
        a.finish_reason = ev.finish_reason or a.finish_reason
        a.stats = ev.stats  # the live object; frozen into a StatsView when the turn ends
        pending.append((ev.text, ev.from_draft))


def on_own_thread(fn: Callable[..., T], *args) -> T:
    """Run fn(*args) on a new thread that frees its MLX streams as it ends; return its result.

    MLX keeps streams per thread and, left behind, they can abort the process at exit; the fix
    is `mx.clear_streams()` as the thread ends. Textual's thread workers run on a pooled
    executor whose threads outlive the job, so the model work gets a thread of its own.
    """
    box: dict = {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as e:  # re-raised on the calling thread
            box["error"] = e
        finally:
            clear_streams()

    t = threading.Thread(target=target, name="mlxspec-model", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    return box.get("result")

