"""Several choices per request (OpenAI's n, a completions batch of prompts) and echo (with the
prompt's logprobs, and max_tokens 0 to score a text, as evaluation harnesses ask for it)."""

import httpx
import pytest

import tiny
from mlxspec.prompts import encode_prompt
from serve_helpers import TIMEOUT, openai_client, running_server, sse_events, tiny_engine
from test_prompt_logprobs import teacher_forced

ASK = [{"role": "user", "content": "Tell me about rivers and the sea."}]
TOL = tiny.float32_tol() * 10  # log-softmax of logits of magnitude ~10, computed in other chunks


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(), model_id="t") as (url, _):
        yield url, tiny_engine()  # the reference: the same weights, its own caches


def post(url, path, body):
    r = httpx.post(f"{url}{path}", json=body, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def test_n_sampled_choices_are_each_the_engine_s_with_seed_plus_j(served):
    url, ref = served
    client = openai_client(url)
    r = client.chat.completions.create(model="t", messages=ASK, max_tokens=16, n=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    want = [ref.generate(ASK, max_tokens=16, temperature=1.0, seed=7 + j) for j in range(3)]
    assert [c.message.content for c in r.choices] == [w.text for w in want]
    assert len({c.message.content for c in r.choices}) == 3  # each differs
    assert r.usage.prompt_tokens == want[0].stats.prompt_tokens  # the prompt counted once
    assert r.usage.completion_tokens == sum(w.stats.tokens for w in want)
    assert r.model_extra["mlxspec"]["target_passes"] == sum(w.stats.rounds for w in want)


def test_streamed_choices_come_in_turn_each_with_its_role_and_finish(served):
    url, _ = served
    body = {"messages": ASK, "max_tokens": 12, "n": 2, "temperature": 1.0, "seed": 3, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as r:
        events = sse_events(r)
    assert events[-1] is None
    usage = events[-2]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    chunks = [e for e in events[:-2]]
    indexes = [c["choices"][0]["index"] for c in chunks]
    assert indexes == sorted(indexes) and set(indexes) == {0, 1}  # choice 0 whole, then choice 1
    whole = post(url, "/v1/chat/completions", dict(body, stream=False, stream_options=None))
    for i in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert [m["finish_reason"] for m in mine].count(None) == len(mine) - 1 and mine[-1]["finish_reason"]
        assert "mlxspec" in chunks[indexes.index(i) + len(mine) - 1]  # its own figures, with its finish
        text = "".join(m["delta"].get("content", "") for m in mine)
        assert text == whole["choices"][i]["message"]["content"]
    assert usage["usage"] == whole["usage"]


def test_greedy_choices_are_alike_and_the_later_ones_reuse_the_prompt(served):
    url, _ = served
    r = post(url, "/v1/chat/completions", {"messages": ASK, "max_tokens": 8, "n": 2})
    a, b = (c["message"]["content"] for c in r["choices"])
    assert a == b and r["mlxspec"]["prefilled_tokens"] < 2 * r["usage"]["prompt_tokens"]


def test_a_batch_of_prompts_gets_each_prompt_s_n_choices_in_order(served):
    url, ref = served
    prompts = ["Once upon a time", [ord(c) for c in "The sea is"], "Rivers"]
    r = post(url, "/v1/completions", {"prompt": prompts, "max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 1})
    assert [c["index"] for c in r["choices"]] == list(range(6))
    want = [ref.generate(p, max_tokens=6, temperature=1.0, seed=1 + j) for p in prompts for j in range(2)]
    assert [c["text"] for c in r["choices"]] == [w.text for w in want]
    assert r["usage"]["prompt_tokens"] == sum(w.stats.prompt_tokens for w in want[::2])
    assert r["usage"]["completion_tokens"] == sum(w.stats.tokens for w in want)


# With stop "<" the five answers end at different lengths (3 and 10 tokens): ranking them per token
# then differs from ranking by their whole log-probability, or by that times their length.
@pytest.mark.parametrize("logprobs, stop", [(None, None), (1, None), (None, "<")])
def test_best_of_returns_the_n_best_by_logprob_per_token(served, logprobs, stop):
    url, ref = served
    r = post(url, "/v1/completions", {"prompt": "Rivers", "max_tokens": 10, "n": 2, "best_of": 5, "stop": stop,
                                      "temperature": 1.0, "seed": 5, "logprobs": logprobs})
    runs = [ref.generate("Rivers", max_tokens=10, temperature=1.0, seed=5 + j, logprobs=0, stop=stop)
            for j in range(5)]
    per_token = [sum(w.logprobs) / len(w.logprobs) for w in runs]
    best = sorted(range(5), key=lambda j: -per_token[j])[:2]
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert [c["text"] for c in r["choices"]] == [runs[j].text for j in best]
    assert len({w.text for w in runs}) == 5  # they differ, so the choice was a real one
    assert r["usage"]["completion_tokens"] == sum(w.stats.tokens for w in runs)  # every generation counts
    if logprobs is None:
        assert all(c["logprobs"] is None for c in r["choices"])
    else:
        assert r["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(runs[best[0]].logprobs, abs=TOL)


def test_echo_starts_the_text_with_the_prompt(served):
    url, ref = served
    r = post(url, "/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "echo": True})
    assert r["choices"][0]["text"] == "Once upon a time" + ref.generate("Once upon a time", max_tokens=6).text
    ids = [ord(c) for c in "The sea"]
    r = post(url, "/v1/completions", {"prompt": ids, "max_tokens": 3, "echo": True})
    assert r["choices"][0]["text"].startswith(ref.tokenizer.decode(ids))


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_every_prompt_token(served, stream):
    url, ref = served
    prompt = "Once upon a time"
    body = {"prompt": prompt, "max_tokens": 5, "echo": True, "logprobs": 2}
    if stream:
        with httpx.stream("POST", f"{url}/v1/completions", json=dict(body, stream=True), timeout=TIMEOUT) as r:
            parts = [e["choices"][0] for e in sse_events(r)[:-1]]
        assert parts[0]["text"] == prompt  # the echoed prompt comes first, with its logprobs
        text = "".join(p["text"] for p in parts)
        lp = {key: [v for p in parts if p["logprobs"] for v in p["logprobs"][key]]
              for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    else:
        choice = post(url, "/v1/completions", body)["choices"][0]
        text, lp = choice["text"], choice["logprobs"]
    ids = encode_prompt(prompt, ref.tokenizer, ref.vocab_size)
    answer = ref.generate(prompt, max_tokens=5, logprobs=2)
    assert text == prompt + answer.text
    assert len(lp["tokens"]) == len(ids) + len(answer.tokens)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    ref_lp = teacher_forced(ref.target_model, ids)
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == pytest.approx(ref_lp[i - 1, ids[i]].item(), abs=TOL)
        assert 1 <= len(lp["top_logprobs"][i]) <= 3  # the 2 best, and the prompt's token where it is not one
        assert lp["top_logprobs"][i][lp["tokens"][i]] == pytest.approx(lp["token_logprobs"][i], abs=TOL)
    assert lp["token_logprobs"][len(ids):] == pytest.approx(answer.logprobs, abs=TOL)
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][len(ids)] == len(prompt)
    assert "".join(lp["tokens"][:len(ids)]) == prompt  # byte tokens: each names its character
    assert lp["text_offset"][:len(ids)] == list(range(len(ids)))  # one character each, from the prompt's start


def completion_logprobs(url, body, stream) -> dict:
    """Each choice's legacy logprobs by index, a stream's chunks put together."""
    if not stream:
        return {c["index"]: c["logprobs"] for c in post(url, "/v1/completions", body)["choices"]}
    with httpx.stream("POST", f"{url}/v1/completions", json=dict(body, stream=True), timeout=TIMEOUT) as r:
        parts = [e["choices"][0] for e in sse_events(r)[:-1]]
    keys = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
    return {i: {key: [v for p in parts if p["index"] == i and p["logprobs"] for v in p["logprobs"][key]]
                for key in keys} for i in {p["index"] for p in parts}}


@pytest.mark.parametrize("stream", [False, True])
def test_text_offsets_count_from_the_prompt_s_start_echoed_or_not(served, stream):
    # OpenAI's: an answer's first offset is the prompt's length; each prompt of a batch counts from its own
    url, ref = served
    prompts = ["Once upon a time", [ord(c) for c in "The sea is"]]
    body = {"prompt": prompts, "max_tokens": 5, "n": 2, "logprobs": 0}
    plain = completion_logprobs(url, body, stream)
    echoed = completion_logprobs(url, dict(body, echo=True), False)
    for i in range(2 * len(prompts)):  # each prompt's 2 choices in turn
        prompt = prompts[i // 2]
        start = len(prompt if isinstance(prompt, str) else ref.tokenizer.decode(prompt))
        offsets = plain[i]["text_offset"]
        assert offsets[0] == start and offsets == sorted(offsets)
        assert offsets == echoed[i]["text_offset"][-len(offsets):]  # where echo puts the answer's tokens


def test_max_tokens_0_with_echo_scores_the_prompt_alone(served):
    url, ref = served
    r = post(url, "/v1/completions", {"prompt": "The sea is wide", "max_tokens": 0, "echo": True, "logprobs": 0})
    choice = r["choices"][0]
    assert choice["text"] == "The sea is wide" and choice["finish_reason"] == "length"
    assert r["usage"]["completion_tokens"] == 0
    assert len(choice["logprobs"]["tokens"]) == r["usage"]["prompt_tokens"] == len("The sea is wide")
    generated = ("drafted", "accepted", "target_passes", "tree_rounds", "lookup_rounds", "seconds",
                 "first_token_seconds", "tokens_per_second")  # the token of the scoring pass is not returned
    assert {key: r["mlxspec"][key] for key in generated} == dict.fromkeys(generated, 0)
    assert r["mlxspec"]["prompt_seconds"] > 0 and r["mlxspec"]["prefilled_tokens"] > 0
    lp = choice["logprobs"]  # logprobs 0: each position's own token alone, as OpenAI's "up to logprobs + 1"
    assert lp["top_logprobs"][1:] == [{name: value} for name, value in zip(lp["tokens"][1:], lp["token_logprobs"][1:])]


def test_an_evaluation_harness_s_loglikelihood_request(served):
    """lm-evaluation-harness's local-completions: token-id prompts in a batch, echo, logprobs 1,
    max_tokens 1; it sums token_logprobs[ctxlen:-1] and checks each is the top choice."""
    url, ref = served
    context, continuation = [ord(c) for c in "The sea is "], [ord(c) for c in "wide"]
    batch = [context + continuation, context + [ord(c) for c in "blue"]]
    r = post(url, "/v1/completions", {"model": "t", "prompt": batch, "max_tokens": 1, "temperature": 0,
                                      "logprobs": 1, "echo": True, "seed": 1234})
    assert len(r["choices"]) == 2
    for ids, choice in zip(batch, sorted(r["choices"], key=lambda c: c["index"])):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 1
        ref_lp = teacher_forced(ref.target_model, ids)
        want = sum(ref_lp[i - 1, ids[i]].item() for i in range(len(context), len(ids)))
        assert sum(lp["token_logprobs"][len(context):-1]) == pytest.approx(want, abs=TOL * len(continuation))
        greedy = all(max(top.values()) == pytest.approx(tl, abs=TOL) for top, tl in
                     zip(lp["top_logprobs"][len(context):-1], lp["token_logprobs"][len(context):-1]))
        assert greedy == all(ref_lp[i - 1].argmax().item() == ids[i] for i in range(len(context), len(ids)))


def test_an_error_in_a_later_prompt_of_a_batch_fails_the_request(served):
    url, _ = served
    r = httpx.post(f"{url}/v1/completions", json={"prompt": ["fine", [1, 2, 10 ** 6]], "max_tokens": 2},
                   timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert post(url, "/v1/completions", {"prompt": "fine", "max_tokens": 2})["choices"]  # and the server goes on


@pytest.mark.parametrize("stream", [False, True])
def test_stop_reason_is_the_stop_string_or_token_that_ended_the_answer(served, stream):
    """vLLM's stop_reason: the stop string found, the stop_token_ids entry met, None otherwise."""
    url, ref = served
    prompt = "Once upon a time"
    plain = ref.generate(prompt, max_tokens=16)
    assert "{" in plain.text and plain.finish_reason == "length"  # so both stops below end it early
    cases = [({"stop": ["{"]}, "{"), ({"stop_token_ids": [plain.tokens[3]]}, plain.tokens[3]), ({}, None)]
    for extra, reason in cases:
        body = dict({"prompt": prompt, "max_tokens": 16, "stream": stream}, **extra)
        if stream:
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as r:
                chunks = [c["choices"][0] for c in sse_events(r) if c and c.get("choices")]
            text, last = "".join(c["text"] for c in chunks), chunks[-1]
        else:
            last = post(url, "/v1/completions", body)["choices"][0]
            text = last["text"]
        want = ref.generate(prompt, max_tokens=16, **extra)
        assert (text, last["finish_reason"], last["stop_reason"]) == (want.text, want.finish_reason, reason), extra
        assert want.stop_reason == reason


def _event(token, text, logprob=-0.5):
    from types import SimpleNamespace

    return SimpleNamespace(token=token, text=text, logprob=logprob, top_logprobs=[])


@pytest.mark.parametrize("first", [b" Hello", b"Hi"])
def test_logprobs_go_out_with_their_text_and_a_dropped_first_space_is_not_counted(first):
    """A SentencePiece decoder drops the text's first space (" Hello" is written "Hello"): the
    offsets are the text's, and a token waits until some of its own text is out."""
    from mlxspec.serve.responses import LogprobStream

    pieces = {1: first, 2: b" world", 3: b"!"}
    written = first.decode().lstrip()  # the text as the decoder writes it
    stream = LogprobStream(False, pieces.__getitem__)
    assert stream.feed([_event(1, written)])["text_offset"] == [0]
    assert stream.feed([_event(2, "")]) is None  # nothing of its text out yet (held back): it waits
    out = stream.feed([_event(3, " ")])  # the first byte of token 2's text comes out with token 3
    assert out["tokens"] == [" world"] and out["text_offset"] == [len(written)]
