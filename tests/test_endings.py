"""vLLM's stop_token_ids, ignore_eos and min_tokens: what ends an answer, and when it may, the same
whatever drafts (benchmark tools send ignore_eos to get answers of a fixed length)."""

import numpy as np
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt
from mlxspec.stats import GenerationStats
from serve_helpers import openai_client, running_server

ASK = [{"role": "user", "content": "say it"}]
EOS = tiny.SPECIALS.index("<|im_end|>")


def scripted(text: str, drafter="ngram"):
    """A model that writes `text`, then EOS at every later position."""
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    from mlxspec.prompts import encode_prompt

    model.say(tok.encode(text, add_special_tokens=False), len(encode_prompt(ASK, tok, tiny.VOCAB)))
    return Engine(model, tok, drafter=drafter), tok


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_stop_token_ids_end_the_answer_as_eos_does(drafter):
    engine, tok = scripted("one two; three", drafter)
    r = engine.generate(ASK, max_tokens=40, stop_token_ids=[ord(";") + 3])
    assert r.text == "one two" and r.finish_reason == "stop" and r.tokens[-1] == ord(";") + 3


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_ignore_eos_runs_to_max_tokens(drafter):
    engine, _ = scripted("short", drafter)
    assert engine.generate(ASK, max_tokens=40).finish_reason == "stop"
    engine.reset()
    r = engine.generate(ASK, max_tokens=40, ignore_eos=True)
    assert len(r.tokens) == 40 and r.finish_reason == "length" and r.tokens[5:] == [EOS] * 35


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_min_tokens_up_to_the_answer_s_own_length_changes_nothing(drafter):
    """The end is banned on rows before min_tokens only: an answer that ends at token 6 on its own
    (5 letters, then EOS at row 5) ends there with any min_tokens up to 5, also where plain steps
    are chained (the chained row's position counts the token still in flight)."""
    for least in range(6):
        engine, _ = scripted("short", drafter)
        r = engine.generate(ASK, max_tokens=40, min_tokens=least)
        assert r.text == "short" and r.tokens[-1] == EOS and len(r.tokens) == 6, least
    engine, _ = scripted("short", drafter)
    assert len(engine.generate(ASK, max_tokens=40, min_tokens=6).tokens) > 6  # row 5 banned: it goes on


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 4}, {"temperature": 0.7, "seed": 1}])
def test_min_tokens_bans_the_end_until_then_on_every_row(drafter, options):
    """A random model that ends early on its own: with min_tokens it cannot, and speculation gives
    plain decoding's tokens (every row before the minimum has the ending tokens banned)."""
    target = tiny.make_llama(0, tie_embeddings=False)
    kw = {"draft_model": tiny.make_llama(0, tie_embeddings=False)} if drafter == "model" else {}
    engine = Engine(target, tiny.make_tokenizer(), drafter=drafter, **kw)
    ending = engine.generate(ASK, max_tokens=30, **options).tokens[2]  # made an ending token: the answer ends early
    engine.reset()
    free = engine.generate(ASK, max_tokens=30, stop_token_ids=[ending], **options)
    assert len(free.tokens) <= 3 and free.finish_reason == "stop"  # a seeded run repeats itself, whatever drafts
    engine.reset()
    plain = engine.generate(ASK, max_tokens=30, stop_token_ids=[ending], min_tokens=12, speculative=False, **options)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=30, stop_token_ids=[ending], min_tokens=12, **options)
    for r in (plain, fast):
        assert len(r.tokens) >= 12 and ending not in r.tokens[:12] and EOS not in r.tokens[:12]
    assert fast.tokens == plain.tokens


@pytest.mark.parametrize("options", [{}, {"temperature": 0.7, "seed": 3}])
def test_min_tokens_bans_the_end_on_a_tree_s_rows_by_their_depth(options):
    """A tree's side leaves come after its chain: a node one token deep may be row 6. Each row's
    ban is its node's position's (a ban by row index let a side leaf's successor end the answer
    early, depending on which trees the cost model chose)."""
    from test_engine_trees import flat_curve

    target, tok = tiny.make_llama(0, tie_embeddings=False), tiny.make_tokenizer()
    free = Engine(target, tok, drafter="none").generate(ASK, max_tokens=30, **options).tokens
    trees = 0
    for at in range(6):
        for least in range(at + 1, at + 8):
            kw = dict(max_tokens=30, stop_token_ids=[free[at]], min_tokens=least, **options)
            plain = Engine(target, tok, drafter="none").generate(ASK, **kw)
            # verifying is as cheap for many rows as for one (`flat_curve`): every round a tree
            engine = Engine(target, tok, drafter="model", draft_model=tiny.make_llama(0, tie_embeddings=False))
            r = flat_curve(engine).generate(ASK, **kw)
            assert r.tokens == plain.tokens, (at, least)
            assert free[at] not in r.tokens[:least]
            trees += r.stats.tree_rounds
    assert trees > 0


@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "seed": 1}])
def test_a_complete_grammar_ends_the_answer_before_min_tokens_one_that_may_go_on_does_not(options):
    """The ban and the grammar together allowed no token at all once a regex was matched: greedy
    decoding stopped on 'NaN logits', sampling with the grammar matcher's error."""
    target, tok = tiny.make_llama(5, tie_embeddings=False, layers=2), tiny.make_tokenizer()
    drafters = {"none": {}, "ngram": {}, "model": {"draft_model": tiny.make_llama(5, tie_embeddings=False, layers=2)}}
    for regex, text in (("ab", "ab"), ("a+", None)):
        kw = dict(max_tokens=12, min_tokens=6, response_format={"type": "regex", "regex": regex}, **options)
        for name, models in drafters.items():
            r = Engine(target, tok, drafter=name, **models).generate(ASK, **kw)
            if text:  # complete after two tokens: it ends there
                assert (r.text, r.finish_reason, r.tokens[-1]) == (text, "stop", EOS), name
            else:  # "a" may go on: no end before the sixth token
                assert len(r.tokens) >= 6 and EOS not in r.tokens[:6] and set(r.text) == {"a"}, name


@pytest.mark.parametrize("options", [{}, {"temperature": 1.0, "seed": 4}])
def test_ignore_eos_past_a_complete_grammar_writes_the_end_again_whatever_drafts(options):
    """Once a grammar is complete only the end may follow, and with ignore_eos the answer goes on
    with it. A pass's rows past a drafted end allowed every token, where plain decoding's ended
    matcher allows only the end: the target then picked another token there (found by the
    random-decision requests with another seed, where a penalty on the repeated end did it)."""
    target, tok = tiny.make_llama(5, tie_embeddings=False, layers=2), tiny.make_tokenizer()
    kw = dict(max_tokens=12, ignore_eos=True, logit_bias={EOS: -20}, response_format={"type": "regex", "regex": "ab"},
              **options)
    plain = Engine(target, tok, drafter="none").generate(ASK, **kw)
    assert plain.tokens == [ord("a") + 3, ord("b") + 3] + [EOS] * 10 and plain.finish_reason == "length"
    draft = tiny.ScriptedModel()  # drafts "ab", then the end at every later position
    draft.say(tok.encode("ab", add_special_tokens=False), len(encode_prompt(ASK, tok, tiny.VOCAB)))
    for tree in ("off", 3):
        engine = Engine(target, tok, drafter="model", num_draft=4, tree=tree, draft_model=draft)
        for _ in range(2):
            r = engine.generate(ASK, **kw)
            assert r.tokens == plain.tokens and r.stats.accepted > 0, tree


def test_a_pass_s_rows_past_a_drafted_end_are_the_ended_matcher_s():
    engine = Engine(tiny.make_llama(5, tie_embeddings=False), tiny.make_tokenizer(), drafter="none")
    a, b = (ord(ch) + 3 for ch in "ab")
    drafted = engine.constraint({"type": "regex", "regex": "ab"})
    rows = np.array(drafted.rows([a, b, EOS, EOS]))
    plain = engine.constraint({"type": "regex", "regex": "ab"})
    plain.commit([a, b, EOS])
    ended = np.array(plain.rows([]))[0]
    assert np.flatnonzero(ended).tolist() == [EOS]
    for row in rows[3:]:
        np.testing.assert_array_equal(row, ended)


@pytest.mark.parametrize("kw, says", [
    ({"stop_token_ids": [tiny.VOCAB]}, "stop_token_ids must be a list of token ids in [0, 259)"),
    ({"stop_token_ids": 5}, "stop_token_ids must be a list"),
    ({"ignore_eos": "yes"}, "ignore_eos must be true or false"),
    ({"min_tokens": 100, "max_tokens": 10}, "min_tokens must be an integer in [0, max_tokens = 10]"),
    ({"min_tokens": -1}, "min_tokens must be"),
])
def test_bad_endings_are_refused(kw, says):
    engine, _ = scripted("x")
    with pytest.raises(InvalidArgumentError, match=__import__("re").escape(says)):
        engine.stream(ASK, **kw)


def test_endings_through_the_server():
    engine, _ = scripted("short answer")
    with running_server(engine, model_id="s") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="s", messages=ASK, max_tokens=30, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 30 and r.choices[0].finish_reason == "length"
        r = client.chat.completions.create(model="s", messages=ASK, max_tokens=30,
                                           extra_body={"stop_token_ids": [ord(" ") + 3]})
        assert r.choices[0].message.content == "short" and r.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_the_last_event_says_which_stop_ended_it_and_the_text_keeps_it_when_asked(drafter):
    """vLLM's stop_reason (the stop string, or the stop token id; None at EOS and at the length)
    and include_stop_str_in_output, alike speculating or not."""
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    engine = Engine(model, tok, drafter=drafter)
    ask = [{"role": "user", "content": "go"}]
    model.say(tok.encode("one, two; three. four", add_special_tokens=False) + [EOS],
              len(encode_prompt(ask, tok, tiny.VOCAB)))
    r = engine.generate(ask, max_tokens=40, stop=[".", ";"])
    assert (r.text, r.finish_reason, r.stop_reason) == ("one, two", "stop", ";")
    r = engine.generate(ask, max_tokens=40, stop=[".", ";"], include_stop_str_in_output=True)
    assert (r.text, r.stop_reason) == ("one, two;", ";")
    comma = tok.encode(",", add_special_tokens=False)[0]
    r = engine.generate(ask, max_tokens=40, stop_token_ids=[comma])
    assert (r.text, r.stop_reason) == ("one", comma)
    r = engine.generate(ask, max_tokens=40)
    assert (r.text, r.finish_reason, r.stop_reason) == ("one, two; three. four", "stop", None)
    assert engine.generate(ask, max_tokens=3).stop_reason is None
    with pytest.raises(InvalidArgumentError, match="include_stop_str_in_output must be True or False"):
        engine.generate(ask, max_tokens=3, include_stop_str_in_output="yes")


def test_stop_reason_and_include_stop_str_in_output_through_the_server():
    engine, tok = scripted("one, two; three. four")
    with running_server(engine, model_id="s") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="s", messages=ASK, max_tokens=40, stop=[";"])
        assert r.choices[0].message.content == "one, two" and r.choices[0].model_extra["stop_reason"] == ";"
        prompt = tok.decode(encode_prompt(ASK, tok, tiny.VOCAB))  # the same prompt, as text
        r = client.completions.create(model="s", prompt=prompt, max_tokens=40, stop=["."],
                                      extra_body={"include_stop_str_in_output": True})
        assert r.choices[0].text == "one, two; three." and r.choices[0].model_extra["stop_reason"] == "."
        chunks = list(client.chat.completions.create(model="s", messages=ASK, max_tokens=40, stop=[";"],
                                                     stream=True, extra_body={"include_stop_str_in_output": True}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "one, two;"
        last = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason][0]
        assert last.model_extra["stop_reason"] == ";"
        r = client.chat.completions.create(model="s", messages=ASK, max_tokens=40, extra_body={
            "stop_token_ids": [tok.encode(",", add_special_tokens=False)[0]]})
        assert r.choices[0].model_extra["stop_reason"] == tok.encode(",", add_special_tokens=False)[0]
        assert client.chat.completions.create(model="s", messages=ASK, max_tokens=40).choices[0].model_extra[
            "stop_reason"] is None


def test_continue_final_message_prefills_the_answer():
    """The answer continues the last (assistant) message: the template renders no new turn, and
    the text is only what follows the prefill."""
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    engine = Engine(model, tok, drafter="ngram")
    prefilled = ASK + [{"role": "assistant", "content": "The answer is"}]
    ids = encode_prompt(prefilled, tok, tiny.VOCAB, continue_final=True)
    assert tok.decode(ids).endswith("<|im_start|>assistant\nThe answer is")
    model.say(tok.encode(" 4.", add_special_tokens=False) + [EOS], len(ids))
    r = engine.generate(prefilled, max_tokens=20, continue_final_message=True)
    assert (r.text, r.stats.prompt_tokens) == (" 4.", len(ids))
    with pytest.raises(InvalidArgumentError, match="continue_final_message needs the last message to be the "
                                                   "assistant's"):
        engine.generate(ASK, max_tokens=2, continue_final_message=True)
    with pytest.raises(InvalidArgumentError, match="continue_final_message need.* chat messages"):
        engine.generate("a string", max_tokens=2, continue_final_message=True)
    with running_server(engine, model_id="s") as (url, _):
        client = openai_client(url)
        r = client.chat.completions.create(model="s", messages=prefilled, max_tokens=20,
                                           extra_body={"continue_final_message": True, "add_generation_prompt": False})
        assert r.choices[0].message.content == " 4." and r.usage.prompt_tokens == len(ids)
        import httpx

        for body, param in (({"continue_final_message": True, "add_generation_prompt": True}, "add_generation_prompt"),
                            ({"add_generation_prompt": False}, "add_generation_prompt"),
                            ({"continue_final_message": True, "messages": ASK}, "continue_final_message")):
            r = httpx.post(f"{url}/v1/chat/completions", json=dict({"messages": prefilled, "max_tokens": 2}, **body))
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_drafts_accepted_past_a_stop_string_are_counted_and_said_apart():
    """A stop string found inside a round's accepted run ends the text there: the drafts accepted
    after it count in the acceptance (the target accepted them) but not in the tokens, and the
    stats say how many, so acceptance and tokens per target pass do not seem to disagree."""
    text = "one two three " * 5
    engine, _ = scripted(text)
    whole = engine.generate(ASK, max_tokens=60, num_draft=8).stats
    assert whole.accepted_past_end == 0 and whole.tokens == whole.rounds + whole.accepted
    engine.reset()
    cut = engine.generate(ASK, max_tokens=60, num_draft=8, stop="three one two three one two three one").stats
    assert cut.accepted_past_end > 0 and cut.tokens == cut.rounds + cut.accepted - cut.accepted_past_end
    assert f"; {cut.accepted_past_end} past the end)" in cut.summary_line()
    assert cut.as_dict()["accepted_past_end"] == cut.accepted_past_end
    scoring = GenerationStats(rounds=1)  # a pass that scores the prompt and emits nothing
    assert scoring.accepted_past_end == 0 and "past the end" not in scoring.summary_line()
