"""Embeddings over HTTP: OpenAI's /v1/embeddings through the official client (its default base64
and floats), llama.cpp's /embedding, Ollama's /api/embed and /api/embeddings through its client;
each the engine's vectors, in line with generations in the queue, with clear errors."""

import base64
import threading
import time

import httpx
import numpy as np
import pytest

import tiny
from serve_helpers import (TIMEOUT, GatedEngine, openai_client, running_server, scrape_metrics, tiny_engine,
                           wait_until)

TEXTS = ["The river runs to the sea.", "Rivers flow into oceans.", "def add(a, b): return a + b"]
TOL = tiny.float32_tol()


@pytest.fixture(scope="module")
def served():
    engine = tiny_engine(drafter="ngram")
    engine.context = 64  # (a short context, for the errors and the truncation)
    with running_server(engine, model_id="t") as (url, _):
        yield url, tiny_engine()


def _vectors(engine, inputs, **kw):
    return np.array(engine.embed(inputs, **kw).vectors)


def test_the_openai_client_gets_the_engine_s_unit_vectors_in_base64_or_floats(served):
    url, ref = served
    client = openai_client(url)
    want = _vectors(ref, TEXTS)
    r = client.embeddings.create(model="anything", input=TEXTS)  # the client asks for base64, then decodes it
    got = np.array([d.embedding for d in r.data])
    np.testing.assert_allclose(got, want, rtol=TOL, atol=TOL)
    assert [d.index for d in r.data] == [0, 1, 2] and r.model == "t" and r.object == "list"
    used = sum(len(ref.tokenizer.encode(t)) for t in TEXTS)
    assert r.usage.prompt_tokens == r.usage.total_tokens == used
    floats = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "float"},
                        timeout=TIMEOUT).json()
    assert floats["data"][0]["object"] == "embedding"
    np.testing.assert_allclose(floats["data"][0]["embedding"], want[0], rtol=TOL, atol=TOL)
    raw = httpx.post(f"{url}/v1/embeddings", json={"input": TEXTS[:1], "encoding_format": "base64"},
                     timeout=TIMEOUT).json()["data"][0]["embedding"]
    # little-endian float32, as OpenAI sends them: the same numbers, bit for bit
    np.testing.assert_array_equal(np.frombuffer(base64.b64decode(raw), "<f4"),
                                  np.float32(floats["data"][0]["embedding"]))
    ids = ref.tokenizer.encode(TEXTS[2])  # token ids, one list or several
    np.testing.assert_allclose(client.embeddings.create(model="t", input=ids).data[0].embedding, want[2],
                               rtol=TOL, atol=TOL)
    assert len(client.embeddings.create(model="t", input=[ids, ids[:3]]).data) == 2


def test_dimensions_keep_the_first_n_normalized_again(served):
    url, ref = served
    raw = _vectors(ref, TEXTS, normalize=-1)[:, :16]
    want = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    got = openai_client(url).embeddings.create(model="t", input=TEXTS, dimensions=16)
    np.testing.assert_allclose([d.embedding for d in got.data], want, rtol=TOL, atol=TOL)
    r = httpx.post(f"{url}/v1/embeddings", json={"input": "x", "dimensions": 65}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
    assert "dimensions must be 1..64 (this model's embeddings have 64), got 65" in r.json()["error"]["message"]
    whole = openai_client(url).embeddings.create(model="t", input=TEXTS, dimensions=64)  # every dimension: allowed
    np.testing.assert_allclose([d.embedding for d in whole.data], _vectors(ref, TEXTS), rtol=TOL, atol=TOL)
    one = openai_client(url).embeddings.create(model="t", input=TEXTS, dimensions=1)
    np.testing.assert_allclose([d.embedding for d in one.data], np.sign(raw[:, :1]), rtol=TOL, atol=TOL)


@pytest.mark.parametrize("body, param, says", [
    ({}, "input", "input is required"),
    ({"input": ""}, "input", "input is empty"),
    ({"input": ["ok", 7]}, "input", "input 1 must be a string or a list of token ids"),
    ({"input": [[3, 99999]]}, "input", "outside the vocabulary"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "encoding_format must be one of float, base64"),
    ({"input": "x", "dimensions": 0}, "dimensions", "dimensions must be an integer >= 1"),
    ({"input": "x", "dimensions": True}, "dimensions", "dimensions must be an integer >= 1"),
    ({"input": "x", "dimensions": "8"}, "dimensions", "dimensions must be an integer >= 1"),
])
def test_bad_openai_bodies_are_400_naming_the_field(served, body, param, says):
    url, _ = served
    r = httpx.post(f"{url}/v1/embeddings", json=body, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and says in r.json()["error"]["message"]


def test_an_input_past_the_context_is_refused_by_openai_s_route_and_cut_by_ollama_s(served):
    url, ref = served
    long = "word " * 40  # 200 byte tokens, past the served context of 64
    r = httpx.post(f"{url}/v1/embeddings", json={"input": ["short", long]}, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "input 1 has 200 tokens, more than the model's context of 64" in r.json()["error"]["message"]
    cut = httpx.post(f"{url}/api/embed", json={"model": "t", "input": long}, timeout=TIMEOUT).json()
    assert cut["prompt_eval_count"] == 64
    np.testing.assert_allclose(cut["embeddings"][0], _vectors(ref, [ref.tokenizer.encode(long)[:64]])[0],
                               rtol=TOL, atol=TOL)
    kept = httpx.post(f"{url}/api/embed", json={"input": long, "truncate": False}, timeout=TIMEOUT)
    assert kept.status_code == 400 and "more than the model's context" in kept.json()["error"]  # Ollama's shape
    older = httpx.post(f"{url}/api/embeddings", json={"prompt": long}, timeout=TIMEOUT).json()  # cuts, as Ollama
    np.testing.assert_allclose(older["embedding"], _vectors(ref, [ref.tokenizer.encode(long)[:64]], normalize=-1)[0],
                               rtol=TOL, atol=TOL)


def test_the_ollama_client_gets_unit_vectors_and_the_older_route_raw_ones(served):
    ollama = pytest.importorskip("ollama")
    url, ref = served
    client = ollama.Client(host=url, timeout=TIMEOUT)
    r = client.embed(model="t", input=TEXTS)
    np.testing.assert_allclose(r.embeddings, _vectors(ref, TEXTS), rtol=TOL, atol=TOL)
    assert r.model == "t" and r.prompt_eval_count == sum(len(ref.tokenizer.encode(t)) for t in TEXTS)
    assert r.total_duration > 0
    t0 = time.perf_counter_ns()
    unnamed = httpx.post(f"{url}/api/embed", json={"model": "", "input": "x"}, timeout=TIMEOUT).json()
    assert unnamed["model"] == "t" and 0 < unnamed["total_duration"] <= time.perf_counter_ns() - t0
    old = client.embeddings(model="t", prompt=TEXTS[0])
    np.testing.assert_allclose(old.embedding, _vectors(ref, TEXTS[0], normalize=-1)[0], rtol=TOL, atol=TOL)
    assert httpx.post(f"{url}/api/embeddings", json={"prompt": ""}, timeout=TIMEOUT).json() == {"embedding": []}
    bad = httpx.post(f"{url}/api/embed", json={"input": "x", "truncate": "yes"}, timeout=TIMEOUT)
    assert bad.status_code == 400 and bad.json() == {"error": "truncate must be true or false, got 'yes'"}


def test_llama_cpp_s_route_nests_each_vector_and_normalizes_as_asked(served):
    url, ref = served
    for path in ("/embedding", "/embeddings"):  # /embeddings with `content` is llama.cpp's too
        r = httpx.post(f"{url}{path}", json={"content": TEXTS[:2], "embd_normalize": -1}, timeout=TIMEOUT).json()
        assert [item["index"] for item in r] == [0, 1] and all(len(item["embedding"]) == 1 for item in r)
        np.testing.assert_allclose([item["embedding"][0] for item in r], _vectors(ref, TEXTS[:2], normalize=-1),
                                   rtol=TOL, atol=TOL)
    taxicab = httpx.post(f"{url}/embedding", json={"content": TEXTS[0], "embd_normalize": 1}, timeout=TIMEOUT).json()
    assert np.abs(taxicab[0]["embedding"][0]).sum() == pytest.approx(1, rel=1e-5)
    unit = httpx.post(f"{url}/embedding", json={"input": TEXTS[0]}, timeout=TIMEOUT).json()  # default 2
    assert np.linalg.norm(unit[0]["embedding"][0]) == pytest.approx(1, rel=1e-5)
    for p in (1.5, -2, True):
        bad = httpx.post(f"{url}/embedding", json={"content": "x", "embd_normalize": p}, timeout=TIMEOUT)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "embd_normalize"
        assert "embd_normalize must be an integer >= -1" in bad.json()["error"]["message"]


def test_embeddings_are_counted_in_the_metrics(served):
    url, _ = served
    before = scrape_metrics(url)
    httpx.post(f"{url}/v1/embeddings", json={"input": ["abc", "de"]}, timeout=TIMEOUT)
    after = scrape_metrics(url)
    counted = 'mlxspec_requests_total{endpoint="embeddings"}'
    assert after[counted] == before[counted] + 1
    assert after["mlxspec_embedding_tokens_total"] == before["mlxspec_embedding_tokens_total"] + 5


class CountingEngine(GatedEngine):
    """A gated engine that counts its embedding calls."""

    embedded = 0

    def embed(self, *args, **kw):
        self.embedded += 1
        return self.engine.embed(*args, **kw)


def test_an_embedding_waits_its_turn_behind_a_generation_and_one_given_up_never_runs():
    engine = CountingEngine(tiny_engine())
    engine.gate.clear()
    with running_server(engine, queue=4) as (url, server):
        queue = server.mlxspec.queue
        chat = threading.Thread(target=httpx.post, args=(f"{url}/v1/chat/completions",),
                                kwargs={"json": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                                        "timeout": TIMEOUT}, daemon=True)
        chat.start()
        wait_until(lambda: engine.started == 1, "a generation holds the engine")
        with pytest.raises(httpx.ReadTimeout):  # waits behind it, then gives up
            httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=0.5)
        wait_until(lambda: queue.waiting == 0, "the abandoned request leaves the queue")
        answer = []
        waiter = threading.Thread(target=lambda: answer.append(
            httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=TIMEOUT)), daemon=True)
        waiter.start()
        wait_until(lambda: queue.waiting == 1, "the next one waits")
        assert engine.embedded == 0  # nothing ran beside the generation
        engine.gate.set()
        chat.join(TIMEOUT)
        waiter.join(TIMEOUT)
        assert answer[0].status_code == 200 and engine.embedded == 1  # the abandoned one never ran


def test_a_model_without_hidden_states_to_pool_is_501_and_the_server_goes_on(monkeypatch):
    import mlxspec.engine
    from mlxspec.errors import IncompatibleModelsError

    def unsplittable(model, check=True):
        raise IncompatibleModelsError("[backbone] odd has no `model` backbone; hidden states are unavailable")

    monkeypatch.setattr(mlxspec.engine, "split_model", unsplittable)
    with running_server(tiny_engine()) as (url, _):
        r = httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=TIMEOUT)
        assert r.status_code == 501 and r.json()["error"]["code"] == "unsupported_model"
        assert "this model gives no embeddings: [backbone] odd has no `model` backbone" in r.json()["error"]["message"]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        assert httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=TIMEOUT).status_code == 200


def test_the_server_pools_as_it_was_told_and_refuses_a_pooling_it_does_not_know():
    from mlxspec.errors import InvalidArgumentError
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.app import make_app

    ref = tiny_engine()
    with running_server(tiny_engine(), pooling="last") as (url, _):
        got = openai_client(url).embeddings.create(model="t", input=TEXTS).data
    np.testing.assert_allclose([d.embedding for d in got], _vectors(ref, TEXTS, pooling="last"), rtol=TOL, atol=TOL)
    assert not np.allclose([d.embedding for d in got], _vectors(ref, TEXTS), atol=1e-3)  # not the mean
    with pytest.raises(InvalidArgumentError, match="pooling must be one of mean, last, got 'cls'"):
        make_app(ref, ServeOptions(pooling="cls"))


class OrderedEngine(GatedEngine):
    """Records the order of its embeddings and generations; embeddings wait for `embed_gate`."""

    def __init__(self, engine):
        super().__init__(engine)
        self.calls = []
        self.embed_gate = threading.Event()

    def embed(self, *args, **kw):
        self.calls.append("embed")
        assert self.embed_gate.wait(TIMEOUT), "the test never opened the gate"
        return self.engine.embed(*args, **kw)

    def stream(self, prompt, **kw):
        self.calls.append("chat")
        return super().stream(prompt, **kw)


def test_a_long_embeddings_request_takes_turns_with_a_chat_slice_by_slice(monkeypatch):
    from mlxspec.serve import embeddings

    monkeypatch.setattr(embeddings, "SLICE_TOKENS", 10)  # 8 tokens an input: one input a slice
    texts = ["abcdefgh", "ijklmnop", "qrstuvwx", "yzabcdef"]
    engine = OrderedEngine(tiny_engine())
    with running_server(engine, queue=1) as (url, server):  # (a full queue does not cut a request taken)
        answers = {}

        def ask(name, path, body):
            answers[name] = httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)

        first = threading.Thread(target=ask, args=("embed", "/v1/embeddings", {"input": texts}), daemon=True)
        first.start()
        wait_until(lambda: engine.calls == ["embed"], "the first slice holds the engine")
        chat = threading.Thread(target=ask, args=("chat", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}), daemon=True)
        chat.start()
        wait_until(lambda: server.mlxspec.queue.waiting == 1, "the chat waits")
        engine.embed_gate.set()
        first.join(TIMEOUT)
        chat.join(TIMEOUT)
    assert engine.calls == ["embed", "chat", "embed", "embed", "embed"]  # the chat ran after the first slice
    assert answers["chat"].status_code == 200
    got = answers["embed"].json()
    assert [d["index"] for d in got["data"]] == [0, 1, 2, 3] and got["usage"]["prompt_tokens"] == 32
    np.testing.assert_allclose([d["embedding"] for d in got["data"]], _vectors(tiny_engine(), texts),
                               rtol=TOL, atol=TOL)


def test_inputs_are_sliced_in_order_by_tokens_a_long_one_alone(monkeypatch):
    from mlxspec.serve import embeddings

    monkeypatch.setattr(embeddings, "SLICE_TOKENS", 4)
    ids = [[1] * n for n in (2, 2, 4, 1, 3, 5, 1)]
    assert [[len(one) for one in group] for group in embeddings._slices(ids)] == [[2, 2], [4], [1, 3], [5], [1]]
    assert embeddings._slices([]) == []


def test_a_new_embeddings_request_is_refused_by_a_full_queue_as_a_chat_is():
    engine = GatedEngine(tiny_engine())
    engine.gate.clear()
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with running_server(engine, queue=1) as (url, server):
        held = [threading.Thread(target=httpx.post, args=(f"{url}/v1/chat/completions",),
                                 kwargs={"json": chat, "timeout": TIMEOUT}, daemon=True) for _ in range(2)]
        held[0].start()
        wait_until(lambda: engine.started == 1, "a generation holds the engine")
        held[1].start()
        wait_until(lambda: server.mlxspec.queue.waiting == 1, "another waits: the queue is full")
        r = httpx.post(f"{url}/v1/embeddings", json={"input": "x"}, timeout=TIMEOUT)
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
        engine.gate.set()
        for thread in held:
            thread.join(TIMEOUT)
