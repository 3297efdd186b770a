"""Structured output (response_format): every token follows the grammar, and speculation stays
lossless against constrained plain decoding, greedy and sampled, for every drafter."""

import json
import math
import re
from typing import Literal

import mlx.core as mx
import numpy as np
import pydantic
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.grammar import Constraint, _said, check_response_format, masked, token_table
from mlxspec.prompts import encode_prompt
from serve_helpers import openai_client, running_server, tiny_engine

ASK = [{"role": "user", "content": "tell me a long story about rivers and the sea, again and again."}]
WORDS = {"type": "regex", "regex": r"[a-z ]{20,40}\."}
MOOD = {"type": "json_schema", "json_schema": {"name": "mood", "schema": {
    "type": "object", "properties": {"ok": {"type": "boolean"}, "mood": {"enum": ["calm", "stormy", "grey"]}},
    "required": ["ok", "mood"], "additionalProperties": False}}}


def engine_for(drafter, tmp_path, **kw):
    """The tiny target and a drafter; the draft model is a copy of the target, which drafts what the
    target would say without the grammar: its drafts leave the grammar where the target's choice does."""
    target = tiny.make_llama(0, tie_embeddings=False)
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(0, tie_embeddings=False)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    return Engine(target, tiny.make_tokenizer(), drafter=drafter, **kw), target


@pytest.mark.parametrize("width", [290, 259, 200])
def test_rows_unpack_the_bitmask_to_the_logits_width(width):
    """Ids past the tokenizer's (an embedding's padding rows) are never allowed; a narrower logit row
    drops the bits past it."""
    tok = tiny.make_tokenizer()
    table = token_table(tok, tok.eos_token_ids)
    c = Constraint(check_response_format({"type": "regex", "regex": "[a-c]x"}), table, tok.eos_token_ids, width)
    rows = np.array(c.rows([ord("b") + 3]))
    assert rows.shape == (2, width) and rows.dtype == np.bool_
    assert np.nonzero(rows[0])[0].tolist() == [ord(ch) + 3 for ch in "abc"]
    assert np.nonzero(rows[1])[0].tolist() == [ord("x") + 3]
    logits = mx.array(np.arange(2 * width, dtype=np.float32).reshape(2, width))
    out = np.array(masked(logits, mx.array(rows)))
    assert np.array_equal(out, np.where(rows, np.array(logits), -np.inf))


def test_rows_past_an_end_of_sequence_draft_allow_the_end_again():
    """With ignore_eos an answer goes on past the end: plain decoding's ended matcher then allows
    only the end again, and so do a draft's rows after its end token."""
    tok = tiny.make_tokenizer()
    eos = min(tok.eos_token_ids)
    c = Constraint(check_response_format({"type": "regex", "regex": "[a-c]x+"}), token_table(tok, tok.eos_token_ids),
                   tok.eos_token_ids, 290)
    x = ord("x") + 3
    rows = np.array(c.rows([ord("b") + 3, x, eos, ord("a") + 3]))
    assert [np.nonzero(r)[0].tolist() for r in rows] == [[ord(ch) + 3 for ch in "abc"], [x], [eos, x]] + [[eos]] * 2
    assert c.allowed([ord("b") + 3, x]) == 2  # the rows left the matcher where it was


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 4}, {"temperature": 0.8, "seed": 3, "num_draft": 3}])
@pytest.mark.parametrize("fmt", [WORDS, MOOD], ids=["regex", "json_schema"])
def test_output_follows_the_grammar_and_is_constrained_plain_decoding(drafter, options, fmt, tmp_path):
    engine, _ = engine_for(drafter, tmp_path)
    plain = engine.generate(ASK, max_tokens=200, response_format=fmt, speculative=False, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=200, response_format=fmt, **options)
    assert fast.finish_reason == plain.finish_reason == "stop"
    if fmt is WORDS:
        assert re.fullmatch(r"[a-z ]{20,40}\.", fast.text), fast.text
    else:
        answer = json.loads(fast.text)
        assert set(answer) == {"ok", "mood"} and isinstance(answer["ok"], bool) and answer["mood"] in ("calm", "stormy", "grey")
    assert fast.tokens == plain.tokens
    if drafter == "ngram" and options == {"num_draft": 4}:
        assert fast.stats.accepted > 0 and fast.stats.rounds < len(fast.tokens)  # drafts were verified and kept


def test_free_text_differs_so_the_grammar_did_something(tmp_path):
    engine, _ = engine_for("none", tmp_path)
    free = engine.generate(ASK, max_tokens=30)
    engine.reset()
    constrained = engine.generate(ASK, max_tokens=30, response_format=WORDS)
    assert not re.fullmatch(r"[a-z ]*\.?", free.text) and re.fullmatch(r"[a-z ]{20,40}\.", constrained.text)
    engine.reset()
    assert engine.generate(ASK, max_tokens=30, response_format={"type": "text"}).tokens == free.tokens


def test_drafts_the_grammar_refuses_are_cut_not_verified(tmp_path):
    """The draft model (the target's copy) drafts the unconstrained choice; where it leaves the grammar the
    draft is cut, so fewer tokens are verified than drafted, and the output is still plain decoding's."""
    engine, _ = engine_for("model", tmp_path)
    plain = engine.generate(ASK, max_tokens=40, response_format=WORDS, speculative=False)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=40, response_format=WORDS, num_draft=4)
    assert fast.tokens == plain.tokens
    free = engine.generate(ASK, max_tokens=40, num_draft=4)
    assert free.stats.accepted == free.stats.drafted or free.stats.rounds > 0  # (the copy's drafts all stand)
    assert fast.stats.drafted < 4 * fast.stats.rounds  # some rounds' drafts were cut before the pass


@pytest.mark.parametrize("options", [{}, {"temperature": 0.7, "seed": 2}])
def test_the_tokens_the_grammar_forces_are_drafted_and_verified(options, tmp_path):
    """A schema's keys are forced: while speculating they are drafted for free (and verified, so
    the output is still plain decoding's); plain decoding drafts nothing."""
    engine, _ = engine_for("ngram", tmp_path)
    fmt = {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"a_rather_long_property_name": {"type": "boolean"},
                                         "and_another_one": {"enum": ["x", "y"]}},
        "required": ["a_rather_long_property_name", "and_another_one"], "additionalProperties": False}}}
    plain = engine.generate(ASK, max_tokens=200, response_format=fmt, speculative=False, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=200, response_format=fmt, **options)
    assert fast.tokens == plain.tokens and json.loads(fast.text)["and_another_one"] in ("x", "y")
    s = fast.stats
    assert s.forced_rounds > 0 and s.forced_accepted >= 20  # the keys' bytes: one token each here
    assert s.forced_drafted <= s.drafted and s.rounds < len(fast.tokens)
    assert plain.stats.forced_rounds == 0 and plain.stats.drafted == 0
    engine.reset()
    fixed0 = engine.generate(ASK, max_tokens=200, response_format=fmt, num_draft=0, **options)
    assert fixed0.tokens == plain.tokens and fixed0.stats.forced_rounds == 0  # num_draft 0: plain decoding


@pytest.mark.slow
def test_sampled_rounds_against_a_drafter_s_q_keep_the_masked_target_s_law(tmp_path):
    """Sampled drafts from a q that ignores the grammar: the first two tokens' laws are the masked
    target's. Their exact laws come from the target, teacher-forced; chi-square at p = 1e-3."""
    target = tiny.make_llama(0, tie_embeddings=False)
    # Another model as the draft: with the target's copy, q on the letters is the masked p times
    # their mass, where even a p left unnormalised would come out right.
    engine = Engine(target, tiny.make_tokenizer(), draft_model=tiny.make_llama(1, tie_embeddings=False))
    fmt = {"type": "regex", "regex": "[a-z][a-z]"}
    letters = [ord(c) + 3 for c in "abcdefghijklmnopqrstuvwxyz"]  # the byte tokenizer: id = byte + 3
    ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
    T = 2.0  # flat enough that q puts mass on the letters and rows past the first are verified

    def law(prefix):
        row = target(mx.array(ids + prefix)[None])[0, -1].astype(mx.float32)
        p = mx.softmax(row[mx.array(letters)] / T).tolist()
        return np.array(p)

    first = law([])
    second = sum(first[i] * law([t]) for i, t in enumerate(letters))
    n = 3000
    firsts, seconds, accepted = np.zeros(26), np.zeros(26), 0
    for seed in range(n):
        r = engine.generate(ASK, max_tokens=4, response_format=fmt, temperature=T, seed=seed, num_draft=2)
        assert len(r.tokens) == 3 and r.tokens[2] in engine.tokenizer.eos_token_ids
        firsts[letters.index(r.tokens[0])] += 1
        seconds[letters.index(r.tokens[1])] += 1
        accepted += r.stats.accepted
    assert accepted > n / 20  # drafts were accepted: verified rounds decided, not only plain steps
    for counts, p in ((firsts, first), (seconds, second)):
        chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
        # 25 degrees of freedom: P(chi2 > 52.6) = 1e-3
        assert chi2 < 52.6, (chi2, counts, n * p)
        assert math.isclose(counts.sum(), n)


def test_the_matcher_refuses_a_token_outside_the_grammar():
    tok = tiny.make_tokenizer()
    fmt = check_response_format({"type": "regex", "regex": r"[a-z ]{1,40}\."})
    c = Constraint(fmt, token_table(tok, tok.eos_token_ids), tok.eos_token_ids, tiny.VOCAB)
    a, dot, upper = ord("a") + 3, ord(".") + 3, ord("A") + 3
    assert c.allowed([a, a, upper, a]) == 2 and c.allowed([a, dot, 2]) == 3
    rows = np.array(c.rows([a, upper, a]))  # rows past the refused draft allow everything
    assert rows[0, a] and not rows[0, upper] and not rows[0, dot] and rows[1, dot] and rows[2].all()
    c.commit([a, dot])
    assert c.matcher.is_stopped()
    with pytest.raises(RuntimeError, match="grammar matcher failed"):
        c.commit([a])


@pytest.mark.parametrize("fmt,says", [
    ("json", "an object with a \"type\""),
    ({"type": "yaml"}, "json_object, json_schema, regex, choice, lark"),
    ({"type": "json_schema"}, "json_schema must be an object"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}}, "must be a JSON Schema object"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "objectt"}}}, "refused"),
    ({"type": "regex", "regex": "(("}, "refused"),
    ({"type": "json_schema", "json_schema": {"schema": {"const": b"x"}}},  # (from Python, not JSON)
     "response_format's JSON schema was refused: Value is not JSON serializable"),
    ({"type": "regex"}, "regex must be a non-empty string"),
    ({"type": "regex", "regex": ""}, "regex must be a non-empty string"),
    ({"type": "regex", "regex": 5}, "regex must be a non-empty string, got 5"),
    ({"type": "choice", "choice": []}, "non-empty list of non-empty strings"),
    ({"type": "choice", "choice": "yes"}, "non-empty list of non-empty strings"),
    ({"type": "choice", "choice": ["a", ""]}, "non-empty list of non-empty strings"),
    ({"type": "lark", "lark": "start: nothing_here"}, "refused"),
])
def test_bad_formats_are_refused_before_anything_runs(fmt, says, tmp_path):
    engine, _ = engine_for("ngram", tmp_path)
    with pytest.raises(InvalidArgumentError, match=re.escape(says)):
        engine.stream(ASK, response_format=fmt)
    assert engine.target.tokens == []  # nothing was fed


def test_an_engine_without_a_tokenizer_says_so():
    engine = Engine(tiny.make_llama(0), None)
    with pytest.raises(InvalidArgumentError, match="needs the model's tokenizer"):
        engine.stream([5, 6, 7], response_format={"type": "json_object"})


# -- through the server ------------------------------------------------------------------------------
class Mood(pydantic.BaseModel):
    ok: bool
    mood: Literal["calm", "stormy", "grey"]


def test_structured_output_through_the_openai_client():
    engine = tiny_engine(drafter="ngram")
    with running_server(engine, model_id="t") as (url, _):
        assert engine._grammar_table is not None  # built at start: no request waits for it
        client = openai_client(url)
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=200, response_format=MOOD)
        answer = json.loads(r.choices[0].message.content)
        assert set(answer) == {"ok", "mood"} and r.choices[0].finish_reason == "stop"
        chunks = list(client.chat.completions.create(model="t", messages=ASK, max_tokens=200, response_format=MOOD,
                                                     stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert json.loads(text) == answer
        parsed = client.chat.completions.parse(model="t", messages=ASK, max_tokens=200, response_format=Mood)
        assert parsed.choices[0].message.parsed == Mood(**answer)  # the client's Pydantic helper, strict schema
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=10,
                                           extra_body={"guided_choice": ["calm", "stormy"]})
        assert r.choices[0].message.content in ("calm", "stormy")
        r = client.completions.create(model="t", prompt="The sea is", max_tokens=200,
                                      extra_body={"response_format": MOOD})
        assert set(json.loads(r.choices[0].text)) == {"ok", "mood"}
        with pytest.raises(Exception) as err:  # the compiler's refusal, from the worker, names the field
            client.chat.completions.create(model="t", messages=ASK, response_format={
                "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectt"}}})
        assert err.value.status_code == 400 and err.value.body["param"] == "response_format"
        r = client.chat.completions.create(model="t", messages=ASK, max_tokens=5)  # the server serves on
        assert r.choices[0].message.content


@pytest.mark.demo
def test_the_demo_target_answers_in_json_with_every_drafter():
    from mlxspec.loading import demo

    if not demo.is_cached():
        pytest.skip("demo GGUF not in the cache; run `mlxspec pull demo`")
    import mlxspec

    engine = mlxspec.load("demo")
    ask = [{"role": "user", "content": "Describe a cat as JSON with its name and age."}]
    schema = {"type": "json_schema", "json_schema": {"name": "cat", "schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": False}}}
    outputs = []
    for drafter in ("none", "ngram", "eagle", "model"):
        engine.reset()
        r = engine.generate(ask, max_tokens=60, response_format=schema, drafter=drafter)
        cat = json.loads(r.text)
        assert set(cat) == {"name", "age"} and isinstance(cat["age"], int) and r.finish_reason == "stop"
        outputs.append(r.tokens)
    assert all(o == outputs[0] for o in outputs)
    # Free text allows the tokenizer's last ids too: the bitmask's words cover all 49,152.
    tok = engine.tokenizer
    free = Constraint(check_response_format({"type": "regex", "regex": "(?s:.+)"}),
                      token_table(tok, tok.eos_token_ids), tok.eos_token_ids, engine.vocab_size)
    row = np.array(free.rows([]))[0]
    assert row.shape == (engine.vocab_size,) and row[-1000:].all() and row.sum() > 0.99 * engine.vocab_size


@pytest.mark.parametrize("fmt,says", [
    ({"type": "regex", "regex": "(("}, "response_format was refused (its regex): invalid regex \"((\""),
    ({"type": "lark", "lark": "start: nothing_here"}, "response_format was refused (its lark): unknown name"),
    ({"type": "json_schema", "json_schema": {"schema": {"type": "objectt"}}},
     "response_format was refused (its JSON schema): Invalid type: objectt"),
])
def test_a_bad_grammar_is_refused_by_the_check_alone(fmt, says):
    """No tokenizer or model needed: `generate --regex` and the server say it before loading or queueing."""
    with pytest.raises(InvalidArgumentError, match=re.escape(says)) as e:
        check_response_format(fmt)
    # on one line, without llguidance's caret lines or the grammar it wrapped the user's in
    assert "\n" not in str(e.value) and "^" not in str(e.value) and "start:" not in str(e.value)
    good = {"regex": {"type": "regex", "regex": "[a-z]+"}, "lark": {"type": "lark", "lark": 'start: "a"'},
            "json_schema": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}[fmt["type"]]
    assert check_response_format(good) == good


def test_a_long_refusal_is_cut_to_400_characters():
    """llguidance quotes the whole regex: a long one would flood a terminal or an API error."""
    head = "response_format was refused (its regex): "
    with pytest.raises(InvalidArgumentError) as e:
        check_response_format({"type": "regex", "regex": "(" + "a" * 600})
    said = str(e.value)
    assert said.startswith(head + 'invalid regex "(aaa') and len(said) == len(head) + 400 and said.endswith("a…")
    assert _said("x" * 400) == "x" * 400 and _said("x" * 401) == "x" * 399 + "…"
    assert _said(" two\n  lines ") == "two lines" and _said(" ") == "unknown error"
