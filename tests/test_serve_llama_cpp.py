"""llama.cpp's POST /completion (Continue's and SillyTavern's llama.cpp providers): a prompt, as text
or token ids, answered as plain decoding answers it, in llama.cpp's shape, whole or streamed; its
json_schema, limits and errors."""

import json
import math

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from serve_helpers import TIMEOUT, built_events, running_server, sse_events, tiny_engine, usage_body
from test_grammar import MOOD

PROMPT = "Rivers run to the sea because"


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield url, tiny_engine()


def post(url, **body):
    return httpx.post(f"{url}/completion", json=body, timeout=TIMEOUT)


def test_a_prompt_is_answered_as_plain_decoding_answers_it(served):
    url, ref = served
    want = ref.generate(PROMPT, max_tokens=24, speculative=False)
    r = post(url, prompt=PROMPT, n_predict=24).json()
    assert r["content"] == want.text and r["stop"] and r["tokens_predicted"] == want.stats.tokens
    assert r["tokens_evaluated"] == want.stats.prompt_tokens and r["model"] == "t" and r["truncated"] is False
    assert r["stop_type"] == {"length": "limit", "stop": "eos"}[want.finish_reason]
    assert r["timings"]["predicted_n"] == want.stats.tokens and "mlxspec" in r
    ids = ref.tokenizer.encode(PROMPT)
    assert post(url, prompt=ids, n_predict=24).json()["content"] == want.text  # token ids: the same prompt
    with httpx.stream("POST", f"{url}/completion", json={"prompt": PROMPT, "n_predict": 24, "stream": True},
                      timeout=TIMEOUT) as s:
        events = sse_events(s)
    assert "".join(e["content"] for e in events) == want.text
    assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True]
    sampled = post(url, prompt=PROMPT, n_predict=16, temperature=0.9, seed=7, top_k=40).json()
    assert sampled["content"] == ref.generate(PROMPT, max_tokens=16, temperature=0.9, seed=7, top_k=40).text
    picked = post(url, prompt=PROMPT, n_predict=4, response_fields=["content", "timings/predicted_n"]).json()
    assert set(picked) == {"content", "timings/predicted_n"} and picked["timings/predicted_n"] == 4


def test_a_json_schema_is_followed_and_time_ends_the_answer_at_a_line(served):
    url, ref = served
    schema = MOOD["json_schema"]["schema"]
    r = post(url, prompt="The weather today:", n_predict=40, json_schema=schema).json()
    mood = json.loads(r["content"])
    assert set(mood) == {"ok", "mood"} and mood["mood"] in ("calm", "stormy", "grey")
    assert r["content"] == ref.generate("The weather today:", max_tokens=40, response_format=MOOD).text
    whole = ref.generate(PROMPT, max_tokens=120, speculative=False, logit_bias={3 + 10: 4.0}).text  # lines
    assert "\n" in whole
    # (llama.cpp's logit_bias: pairs, or an object; false bans a token)
    assert post(url, prompt=PROMPT, n_predict=120, logit_bias={"13": 4.0}).json()["content"] == whole
    first = whole.encode()[0] + 3  # the answer's first token (the byte tokenizer's ids follow 3 specials)
    banned = post(url, prompt=PROMPT, n_predict=120, logit_bias=[[13, 4.0], [first, False]]).json()["content"]
    assert banned != whole and banned == ref.generate(PROMPT, max_tokens=120, logit_bias={13: 4.0, first: -100}).text
    r = post(url, prompt=PROMPT, n_predict=120, logit_bias=[[13, 4.0]], t_max_predict_ms=1e-6).json()
    assert (r["content"], r["stop_type"]) == (whole[: whole.index("\n") + 1], "limit")


@pytest.mark.parametrize("body, param, says", [
    ({"prompt": ["two", "prompts"]}, "prompt", "one prompt per request"),
    ({"prompt": ""}, "prompt", "prompt must be a non-empty string"),
    ({"n_predict": 8}, "prompt", "prompt must be"),
    ({"prompt": PROMPT, "grammar": "root ::= \"yes\""}, "grammar", "send json_schema instead"),
    ({"prompt": PROMPT, "json_schema": "an object"}, "json_schema", "json_schema"),
    ({"prompt": PROMPT, "json_schema": {"type": "objekt"}}, "json_schema", "json_schema was refused: "),
    ({"prompt": PROMPT, "repeat_penalty": 1.1, "repeat_last_n": -2}, "repeat_last_n",
     "repeat_last_n must be an integer >= -1 (the last tokens repeat_penalty looks back over; -1: the whole context"),
    ({"prompt": PROMPT, "n_predict": -5}, "n_predict", "n_predict must be an integer >= -1"),
    ({"prompt": PROMPT, "n_predict": True}, "n_predict", "n_predict must be an integer >= -1"),
    ({"prompt": PROMPT, "n_predict": -2}, "n_predict", "n_predict must be an integer >= -1"),
    ({"prompt": PROMPT, "n_indent": "4"}, "n_indent", "n_indent must be an integer"),
    ({"prompt": PROMPT, "max_tokens": 4}, "max_tokens", "send n_predict instead"),
    ({"prompt": PROMPT, "logit_bias": [["Hello", 1.0]]}, "logit_bias", "tokens are named by id here"),
    ({"prompt": PROMPT, "logit_bias": {"13": 500}}, "logit_bias", "logit_bias"),
    ({"prompt": PROMPT, "n_probs": 1001}, "n_probs", "n_probs must be an integer in 0..1000"),
    ({"prompt": PROMPT, "n_probs": "5"}, "n_probs", "n_probs must be an integer"),
    ({"prompt": PROMPT, "return_tokens": "yes"}, "return_tokens", "return_tokens must be true or false"),
    ({"prompt": PROMPT, "response_fields": "content"}, "response_fields", "response_fields must be a list"),
])
def test_bad_requests_are_refused_naming_the_field(served, body, param, says):
    url, _ = served
    r = post(url, **body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_props_say_the_context_the_slots_and_the_template(served):
    url, ref = served
    p = httpx.get(f"{url}/props", timeout=TIMEOUT).json()
    settings = p["default_generation_settings"]
    assert settings["n_ctx"] == ref.context and p["total_slots"] == 1 and not settings["is_processing"]
    assert settings["params"]["n_predict"] == 512 and settings["params"]["temperature"] == 0.0  # the server's defaults
    assert p["chat_template"] == ref.tokenizer.chat_template and p["model_alias"] == "t"
    assert p["modalities"] == {"vision": False, "audio": False} and p["build_info"].startswith("mlxspec ")
    assert {key: settings[key] for key in ("id", "id_task", "speculative")} == {"id": 0, "id_task": -1,
                                                                            "speculative": True}
    assert {key: settings["params"][key] for key in ("seed", "post_sampling_probs", "repeat_last_n", "repeat_penalty",
                                                     "presence_penalty", "frequency_penalty", "stop")} == {
        "seed": -1, "post_sampling_probs": False, "repeat_last_n": 64, "repeat_penalty": 1.0,
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": []}  # llama-server's: nothing changes the model's
    assert (p["model_path"], p["bos_token"], p["eos_token"]) == ("t", ref.tokenizer.bos_token or "",
                                                                 ref.tokenizer.eos_token)
    assert (p["is_sleeping"], p["endpoint_slots"], p["endpoint_props"], p["endpoint_metrics"]) == (
        False, False, False, True)  # what this server answers: /metrics, not /slots or POST /props


def test_n_predict_0_reads_the_prompt_only_and_1_writes_one_token(served):
    url, ref = served
    warm = post(url, prompt=PROMPT, n_predict=0, n_probs=2, return_tokens=True).json()
    assert (warm["content"], warm["tokens_predicted"], warm["stop_type"], warm["timings"]["predicted_n"]) == (
        "", 0, "eos", 0)
    assert warm["tokens_evaluated"] == len(ref.tokenizer.encode(PROMPT)) and warm["tokens"] == []
    assert warm["completion_probabilities"] == []
    one = post(url, prompt=PROMPT, n_predict=1, return_tokens=True).json()
    want = ref.generate(PROMPT, max_tokens=1, speculative=False)
    assert (one["content"], one["tokens"], one["tokens_predicted"], one["stop_type"]) == (
        want.text, want.tokens, 1, "limit")


def spelt(rows) -> str:
    """The text `completion_probabilities` rows spell (a random model writes bytes that are no UTF-8,
    which the text has as U+FFFD)."""
    return b"".join(bytes(row["bytes"]) for row in rows).decode("utf-8", "replace")


def test_n_probs_are_the_model_s_own_for_the_tokens_that_spell_the_text(served):
    """llama.cpp's completion_probabilities (its post_sampling_probs false): each token's log-probability
    and its position's best, under the raw logits, as plain decoding computes them; with return_tokens
    the ids. Whole or streamed, the tokens listed spell the text sent with them, a stop string's aside."""
    url, ref = served
    want = ref.generate(PROMPT, max_tokens=24, speculative=False, logprobs=3)
    tol = tiny.float32_tol(1e-4) * 10  # log-softmax of logits of magnitude ~10, verify rows against plain steps
    r = post(url, prompt=PROMPT, n_predict=24, n_probs=3, return_tokens=True).json()
    rows = r["completion_probabilities"]
    assert r["content"] == want.text and r["tokens"] == want.tokens[:len(rows)] == [row["id"] for row in rows]
    assert spelt(rows) == r["content"]
    for row, lp, best in zip(rows, want.logprobs, want.top_logprobs):
        assert abs(row["logprob"] - lp) <= tol and len(row["top_logprobs"]) == 3
        assert [t["id"] for t in row["top_logprobs"]] == [t for t, _ in best]
        assert all(abs(t["logprob"] - v) <= tol for t, (_, v) in zip(row["top_logprobs"], best))
        assert all(t["token"] == bytes(t["bytes"]).decode("utf-8", "replace") for t in row["top_logprobs"])
    with httpx.stream("POST", f"{url}/completion", json={"prompt": PROMPT, "n_predict": 24, "stream": True,
                                                          "n_probs": 3, "return_tokens": True}, timeout=TIMEOUT) as s:
        events = sse_events(s)
    *parts, last = events
    for part in parts:  # each chunk's tokens spell its own text
        assert part["tokens"] == [row["id"] for row in part["completion_probabilities"]]
        assert spelt(part["completion_probabilities"]) == part["content"]
    assert [t for part in parts for t in part["tokens"]] == r["tokens"] and last["tokens"] == []
    plain = post(url, prompt=PROMPT, n_predict=8).json()  # neither asked: no ids, no probabilities
    assert plain["tokens"] == [] and "completion_probabilities" not in plain
    at = next(i for i in range(4, len(want.text) - 2) if want.text.find(want.text[i:i + 2]) == i)
    stop = want.text[at:at + 2]  # its first place is past the answer's start
    cut = post(url, prompt=PROMPT, n_predict=24, n_probs=1, stop=[stop]).json()
    assert cut["stopping_word"] == stop and cut["content"] == want.text[:at]
    assert spelt(cut["completion_probabilities"]) == cut["content"] and len(cut["completion_probabilities"]) < len(rows)


def test_n_probs_past_the_vocabulary_list_all_of_it(served):
    url, _ = served
    (row,) = post(url, prompt=PROMPT, n_predict=1, n_probs=1000).json()["completion_probabilities"]
    assert len(row["top_logprobs"]) == tiny.VOCAB and len({t["id"] for t in row["top_logprobs"]}) == tiny.VOCAB
    assert math.isclose(sum(math.exp(t["logprob"]) for t in row["top_logprobs"]), 1.0, rel_tol=1e-4)
    assert row["top_logprobs"][0]["logprob"] == max(t["logprob"] for t in row["top_logprobs"])


def test_post_sampling_probs_are_the_distribution_each_token_was_drawn_from(served):
    """llama.cpp's post_sampling_probs: `prob` and `top_probs`, linear, after temperature and the
    filters: only the tokens top_k kept, summing to 1; greedy, the chosen token's 1 alone. Equal to
    the engine's own, plain decoding's, whatever drafted."""
    url, ref = served
    sampled = dict(temperature=0.9, seed=4, top_k=3)
    want = ref.generate(PROMPT, max_tokens=12, speculative=False, logprobs=5, post_sampling_probs=True, **sampled)
    r = post(url, prompt=PROMPT, n_predict=12, n_probs=5, post_sampling_probs=True, **sampled).json()
    rows = r["completion_probabilities"]
    assert r["content"] == want.text and rows and spelt(rows) == r["content"]
    tol = tiny.float32_tol(1e-4) * 10  # probabilities of logits ~10, verify rows against plain steps
    for row, lp, best in zip(rows, want.logprobs, want.top_logprobs):
        assert "logprob" not in row and "top_logprobs" not in row
        assert len(row["top_probs"]) == 3  # top_k's three, though five were asked for
        assert math.isclose(sum(t["prob"] for t in row["top_probs"]), 1.0, rel_tol=1e-5)
        assert abs(row["prob"] - math.exp(lp)) <= tol and row["prob"] in [t["prob"] for t in row["top_probs"]]
        assert [t["id"] for t in row["top_probs"]] == [t for t, _ in best]
    raw = post(url, prompt=PROMPT, n_predict=12, n_probs=5, **sampled).json()["completion_probabilities"]
    assert all(len(row["top_logprobs"]) == 5 for row in raw)  # without it, the model's own: five listed
    greedy = post(url, prompt=PROMPT, n_predict=4, n_probs=5, post_sampling_probs=True).json()
    for row in greedy["completion_probabilities"]:
        assert row["prob"] == 1.0 and row["top_probs"] == [{k: row[k] for k in ("id", "token", "bytes", "prob")}]


def test_apply_template_gives_the_text_completion_answers_as_the_chat_is_answered(served):
    url, ref = served
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why do rivers flow?"}]
    r = httpx.post(f"{url}/apply-template", json={"messages": chat}, timeout=TIMEOUT)
    prompt = r.json()["prompt"]
    assert r.status_code == 200 and set(r.json()) == {"prompt"}
    assert ref.tokenizer.encode(prompt, add_special_tokens=False) == httpx.post(
        f"{url}/tokenize", json={"messages": chat}, timeout=TIMEOUT).json()["tokens"]
    answered = httpx.post(f"{url}/v1/chat/completions", json={"messages": chat, "max_tokens": 16, "temperature": 0},
                          timeout=TIMEOUT).json()["choices"][0]["message"]["content"]
    assert post(url, prompt=prompt, n_predict=16, temperature=0).json()["content"] == answered
    begun = chat + [{"role": "assistant", "content": "Because"}]
    kept = httpx.post(f"{url}/apply-template", json={"messages": begun, "continue_final_message": True},
                      timeout=TIMEOUT).json()["prompt"]
    assert kept.startswith(prompt) and kept.endswith("Because")  # the answer goes on inside that message
    for body, says in (({}, "messages is required"),
                       ({"messages": "hi"}, "messages"),
                       ({"messages": chat, "add_generation_prompt": False}, "add_generation_prompt false alone")):
        r = httpx.post(f"{url}/apply-template", json=body, timeout=TIMEOUT)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text


@pytest.mark.parametrize("value, context, limit", [(None, 64, 512), (-1, 64, 64), (-1, None, None), (0, 64, 0),
                                                   (7, 64, 7)])
def test_n_predict_is_the_answer_s_length_and_minus_1_the_context_s(value, context, limit):
    from types import SimpleNamespace

    from mlxspec.serve.llama_cpp import n_predict
    from mlxspec.serve.ollama import UNBOUNDED

    state = SimpleNamespace(engine=SimpleNamespace(context=context), options=SimpleNamespace(max_tokens=512))
    assert n_predict(value, state) == (UNBOUNDED if limit is None else limit)


@pytest.mark.parametrize("body, limits", [
    ({"n_indent": 4, "t_max_predict_ms": 250}, {"min_indent": 4, "soft_time_limit": 0.25}),
    ({"n_indent": 1, "t_max_predict_ms": 0.5}, {"min_indent": 1, "soft_time_limit": 0.0005}),
    ({"n_indent": 0, "t_max_predict_ms": 0}, {}), ({"n_indent": -1, "t_max_predict_ms": -1}, {}),
    ({"t_max_predict_ms": float("inf")}, {}), ({}, {})])
def test_n_indent_and_t_max_predict_ms_are_limits_only_when_positive(body, limits):
    from mlxspec.serve.llama_cpp import _line_limits

    assert _line_limits(body) == limits


@pytest.mark.parametrize("body, param", [({"n_indent": True}, "n_indent"), ({"n_indent": 2.0}, "n_indent"),
                                         ({"t_max_predict_ms": True}, "t_max_predict_ms"),
                                         ({"t_max_predict_ms": "5"}, "t_max_predict_ms"),
                                         ({"t_max_predict_ms": float("nan")}, "t_max_predict_ms")])
def test_a_line_limit_that_is_not_a_number_is_refused(body, param):
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.llama_cpp import _line_limits

    with pytest.raises(APIError) as e:
        _line_limits(body)
    assert e.value.status == 400 and e.value.param == param and e.value.message.startswith(f"{param} must be")


@pytest.mark.parametrize("given, bias", [
    ([[13, 2.0], ["14", -1]], {"13": 2.0, "14": -1}), ({"13": False, "7": 0.5}, {"13": -100, "7": 0.5}),
    ([[13, False]], {"13": -100}), ([], {})])
def test_logit_bias_in_llama_cpp_s_forms_is_openai_s(given, bias):
    from mlxspec.serve.llama_cpp import _bias

    assert _bias(given) == bias


@pytest.mark.parametrize("given", ["13", [5], [[1, 2, 3]], [[True, 1]], [[1.5, 1]], [["x", 1]], {"-1": 1}])
def test_logit_bias_that_is_not_pairs_of_token_ids_is_refused(given):
    from mlxspec.serve.errors import APIError
    from mlxspec.serve.llama_cpp import _bias

    with pytest.raises(APIError) as e:
        _bias(given)
    assert e.value.param == "logit_bias" and "tokens are named by id here" in e.value.message


def _builder(warm_only=False):
    from mlxspec.serve.llama_cpp import LlamaBuilder

    return LlamaBuilder("completion", "t", None, warm_only=warm_only, truncated=False)


@pytest.mark.parametrize("warm_only", [False, True])
def test_timings_are_llama_server_s_from_the_engine_s_seconds(warm_only):
    from mlxspec.stats import GenerationStats

    stats = GenerationStats(prefilled_tokens=10, prompt_seconds=0.5, seconds=2.0)
    usage = usage_body(12, 2, 8)
    r = _builder(warm_only).whole("", "ab\nc", [], "length", usage, stats)
    n = 0 if warm_only else 8
    assert r["timings"] == {"prompt_n": 10, "prompt_ms": 500.0, "prompt_per_token_ms": 50.0, "prompt_per_second": 20.0,
                            "predicted_n": n, "predicted_ms": 2000.0, "predicted_per_token_ms": 2000.0 / max(n, 1),
                            "predicted_per_second": n / 2.0}
    assert (r["index"], r["content"], r["has_new_line"], r["tokens_predicted"], r["stop_type"], r["tokens_cached"]) == (
        0, "" if warm_only else "ab\nc", not warm_only, n, "eos" if warm_only else "limit", 2)
    nothing = _builder(warm_only).whole("", "", [], "stop", dict(usage, completion_tokens=0), GenerationStats())
    assert nothing["timings"]["prompt_per_token_ms"] == nothing["timings"]["predicted_per_token_ms"] == 0.0


def test_a_stream_event_carries_text_only_and_none_when_reading_the_prompt_only():
    assert _builder().feed("", "", []) == [] and _builder(warm_only=True).feed("", "x", []) == []
    (event,) = _builder().feed("", "x", [])
    assert built_events([event]) == [{"index": 0, "content": "x", "tokens": [], "stop": False}]


def test_repeat_last_n_minus_1_is_the_whole_context_and_0_turns_the_penalty_off(served):
    """As llama.cpp reads them (SillyTavern sends its penalty range as repeat_last_n, 0 for none)."""
    url, ref = served
    plain = ref.generate(PROMPT, max_tokens=30, speculative=False).text
    window = post(url, prompt=PROMPT, n_predict=30, repeat_penalty=1.5, repeat_last_n=8).json()["content"]
    assert window == ref.generate(PROMPT, max_tokens=30, repetition_penalty=1.5, repetition_context_size=8).text
    assert window != plain  # (the penalty changes this answer)
    whole = post(url, prompt=PROMPT, n_predict=30, repeat_penalty=1.5, repeat_last_n=-1).json()["content"]
    assert whole == ref.generate(PROMPT, max_tokens=30, repetition_penalty=1.5,
                                 repetition_context_size=ref.context).text
    assert post(url, prompt=PROMPT, n_predict=30, repeat_penalty=1.5, repeat_last_n=0).json()["content"] == plain


def test_what_sillytavern_sends_is_answered(served):
    """Its llama.cpp body: seed -1 (random, llama.cpp's default), grammar "" (none), runner settings
    (cache_prompt, samplers, n_keep...) that change nothing here."""
    url, ref = served
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0.05, "typical_p": 1,
            "repeat_penalty": 1.1, "repeat_last_n": 0, "presence_penalty": 0, "frequency_penalty": 0, "mirostat": 0,
            "grammar": "", "n_probs": 0, "seed": -1, "ignore_eos": False, "dry_multiplier": 0, "xtc_probability": 0,
            "cache_prompt": True, "n_keep": -1, "samplers": ["top_k", "typical_p", "top_p", "min_p", "temperature"],
            "stop": ["\n\n"], "json_schema": None, "stream": False}
    r = post(url, **body)
    assert r.status_code == 200, r.text
    assert r.json()["content"] == ref.generate(PROMPT, max_tokens=12, stop=["\n\n"], speculative=False).text
    sampled = [post(url, **dict(body, temperature=1, n_predict=6)).json()["content"] for _ in range(3)]
    assert len(set(sampled)) > 1  # seed -1: a random seed each time, not one seed


def test_ignore_eos_writes_past_the_end_of_text():
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    model.say(tok.encode("Done.", add_special_tokens=False) + [end], len(tok.encode(PROMPT)))
    with running_server(Engine(model, tok), model_id="s") as (url, _):
        assert post(url, prompt=PROMPT, n_predict=20).json()["tokens_predicted"] == 6
        past = post(url, prompt=PROMPT, n_predict=20, ignore_eos=True).json()
        assert past["tokens_predicted"] == 20 and past["stop_type"] == "limit"
