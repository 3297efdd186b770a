"""One engine used from several threads: a clear error while another thread's generation runs,
overtaking from any thread while a stream waits for its consumer, and a thread that ran a
generation freeing its MLX streams as it ends."""

import threading

import pytest

import tiny
from mlxspec import Engine, EngineBusyError, StreamOvertakenError
from test_engine import PROMPT, draft, target  # noqa: F401 (the engine tests' models, as fixtures)

OTHER = list(range(30, 42))


class Rendezvous:
    """A cancel signal whose `is_set()` (asked inside the loop, while the engine is held) lets
    another thread act before the generation goes on; never set."""

    def __init__(self):
        self.inside = threading.Event()
        self.go_on = threading.Event()

    def is_set(self):
        if not self.inside.is_set():
            self.inside.set()
            assert self.go_on.wait(30), "the other thread never let the generation go on"
        return False


def run_on_thread(fn):
    box = {}

    def body():
        try:
            box["result"] = fn()
        except BaseException as e:  # checked by the caller
            box["error"] = e

    t = threading.Thread(target=body, name="worker-a")
    t.start()
    return t, box


@pytest.mark.parametrize("drafter", ["model", "ngram", "none"])
def test_a_second_thread_gets_engine_busy_while_one_runs(target, draft, drafter):
    fresh = {tuple(p): Engine(target, None, draft, drafter=drafter).generate(p, max_tokens=20).tokens
             for p in (PROMPT, OTHER)}
    e = Engine(target, None, draft, drafter=drafter)
    gate = Rendezvous()
    t, box = run_on_thread(lambda: e.generate(PROMPT, max_tokens=20, cancel=gate).tokens)
    assert gate.inside.wait(30)
    with pytest.raises(EngineBusyError, match=r"another thread \(worker-a\).*engine\.fork\(\)"):
        e.generate(OTHER, max_tokens=20)
    with pytest.raises(EngineBusyError):
        e.reset()
    forked = e.fork()  # its own caches: runs beside the busy one
    assert forked.generate(OTHER, max_tokens=20).tokens == fresh[tuple(OTHER)]
    gate.go_on.set()
    t.join(60)
    assert box.get("result") == fresh[tuple(PROMPT)], box.get("error")  # the refused call left it untouched
    assert e.generate(OTHER, max_tokens=20).tokens == fresh[tuple(OTHER)]  # and the engine is free again


def test_a_waiting_stream_is_overtaken_from_another_thread(target, draft):
    fresh = Engine(target, None, draft, drafter="model").generate(OTHER, max_tokens=20).tokens
    e = Engine(target, None, draft, drafter="model")
    old = e.stream(PROMPT, max_tokens=30)
    for _ in range(4):  # suspended between events: it holds nothing
        next(old)
    t, box = run_on_thread(lambda: e.generate(OTHER, max_tokens=20).tokens)
    t.join(60)
    assert box.get("result") == fresh, box.get("error")
    with pytest.raises(StreamOvertakenError):
        next(old)


def test_closing_a_waiting_stream_while_another_thread_runs_leaves_that_one_alone(target, draft):
    fresh = Engine(target, None, draft, drafter="model").generate(OTHER, max_tokens=20).tokens
    e = Engine(target, None, draft, drafter="model")
    old = e.stream(PROMPT, max_tokens=30)
    next(old)
    gate = Rendezvous()
    t, box = run_on_thread(lambda: e.generate(OTHER, max_tokens=20, cancel=gate).tokens)
    assert gate.inside.wait(30)
    old.close()  # the running request overtook it already: nothing to end, nothing to roll back
    gate.go_on.set()
    t.join(60)
    assert box.get("result") == fresh, box.get("error")


def test_a_thread_that_ran_a_generation_frees_its_streams_as_it_ends(target, monkeypatch):
    from mlxspec import device

    cleared = []
    monkeypatch.setattr(device, "_clear_mlx_streams", lambda: cleared.append(threading.get_ident()))
    e = Engine(target, None, drafter="none")
    e.generate(PROMPT, max_tokens=4)  # the main thread: the process frees its streams
    assert cleared == []
    idents, before_end = [], []

    def body():
        idents.append(threading.get_ident())
        for _ in range(2):  # once per thread, however many requests it runs
            e.generate(PROMPT, max_tokens=4)
        before_end.extend(cleared)  # none yet: after clearing, the thread could not use MLX again

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert before_end == [] and cleared == idents


@pytest.fixture(scope="module")
def head(target, tmp_path_factory):
    return tiny.make_eagle_head(target, tmp_path_factory.mktemp("head"), seed=3)


@pytest.mark.parametrize("drafter, clears", [("eagle", False), ("eagle", True), ("model", False), ("ngram", False)])
def test_a_stream_whose_thread_ended_resumes_elsewhere_and_the_engine_serves_on(target, draft, head, drafter,
                                                                                clears):
    """A pool thread that ends (an idle worker) leaves arrays it built, which die with its streams:
    the engine evaluates what it keeps first. (With the head, both used to fail with 'There is no
    Stream(cpu, 1) in current thread', before and after its streams were freed.)"""
    make = lambda: Engine(target, None, draft, eagle_head=head, drafter=drafter, num_draft=4)  # noqa: E731
    fresh = {tuple(p): make().generate(p, max_tokens=20).tokens for p in (PROMPT, OTHER)}
    e = make()
    box = {}

    def start():
        box["stream"] = e.stream(PROMPT, max_tokens=20)
        box["said"] = [next(box["stream"]).token for _ in range(4)]
        if clears:  # as the chat's and the server's own threads do as they end: the engine settles first
            from mlxspec.device import clear_streams

            clear_streams()

    t = threading.Thread(target=start)
    t.start()
    t.join()
    assert box["said"] + [ev.token for ev in box["stream"]] == fresh[tuple(PROMPT)]
    assert e.generate(OTHER, max_tokens=20).tokens == fresh[tuple(OTHER)]


def test_a_takeover_that_fails_leaves_the_engine_to_other_threads():
    from mlxspec.occupancy import Occupancy

    occupancy = Occupancy()
    with pytest.raises(ZeroDivisionError):  # ending the open stream failed (say, a rank lost)
        occupancy.enter(then=lambda: 1 / 0)
    t, box = run_on_thread(occupancy.try_enter)
    t.join(10)
    assert box.get("result") is True
