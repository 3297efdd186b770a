"""A thinking model's reasoning: split from its answer in the server's chat answers (mlx-lm's
`reasoning` key), streamed or not, and chat_template_kwargs (e.g. enable_thinking) for its template."""

import json
import re

import httpx
import numpy as np
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.grammar import AfterThinking, Constraint, check_response_format, token_table
from mlxspec.prompts import encode_prompt
from mlxspec.reasoning import ReasoningSplitter, starts_inside, thinking_markers
from serve_helpers import TIMEOUT, iter_sse, running_server

MARKERS = ("<think>", "</think>")
THINKING = ["<think>", "</think>"]
VOCAB = tiny.VOCAB + len(THINKING)
# Qwen3's way: the model opens the block itself, unless enable_thinking is false (then the template
# writes an empty one).
HYBRID = tiny.CHAT_TEMPLATE + "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}" \
                              "<think>\n\n</think>\n\n{% endif %}"
# DeepSeek-R1's and Qwen3-Thinking's way: the template opens it, the model closes it.
OPENING = tiny.CHAT_TEMPLATE + "{% if add_generation_prompt %}<think>\n{% endif %}"
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def scripted_thinker(says: str, ask=ASK) -> Engine:
    """An engine whose model, asked `ask`, writes `says` inside the thinking block the template
    opened (e.g. "Add them.</think>It is 4."), then ends."""
    tok = tiny.make_tokenizer(OPENING, added=THINKING)
    model = tiny.ScriptedModel(vocab=VOCAB)
    model.say(tok.encode(says, add_special_tokens=False) + [tiny.SPECIALS.index("<|im_end|>")],
              len(encode_prompt(ask, tok, VOCAB)))
    return Engine(model, tok, drafter="ngram")


def split(text, chunks, inside=False):
    s = ReasoningSplitter(MARKERS, inside)
    got = [s.feed(text[a:b]) for a, b in zip(chunks, chunks[1:])] + [s.finish()]
    return "".join(r for r, _ in got), "".join(a for _, a in got)


@pytest.mark.parametrize("text, inside, reasoning, answer", [
    ("<think>\nsum it\n</think>\n\nIt is 4.", False, "\nsum it\n", "It is 4."),
    ("It is 4.", False, "", "It is 4."),
    ("sum it</think>It is 4.", True, "sum it", "It is 4."),
    ("<think>cut off mid-thou", False, "cut off mid-thou", ""),
    ("a <thin b </think> c", False, "", "a <thin b </think> c"),  # a closing marker outside a block is text
    ("<think>x</think>\n\n", False, "x", ""),
])
def test_every_chunking_splits_alike(text, inside, reasoning, answer):
    n = len(text)
    cuts = [[0, n]] + [[0, i, n] for i in range(1, n)] + [list(range(n + 1))]
    for chunks in cuts:
        assert split(text, chunks, inside) == (reasoning, answer), chunks


def test_markers_come_from_the_vocabulary_and_the_prompt_says_where_generation_starts():
    assert thinking_markers(tiny.make_tokenizer()) is None
    tok = tiny.make_tokenizer(HYBRID, added=THINKING)
    assert thinking_markers(tok) == MARKERS
    assert not starts_inside("<|im_start|>assistant\n", MARKERS)
    assert not starts_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n", MARKERS)
    assert starts_inside("<|im_start|>assistant\n<think>\n", MARKERS)


def test_chat_template_kwargs_reach_the_template():
    tok = tiny.make_tokenizer(HYBRID, added=THINKING)
    on = encode_prompt(ASK, tok, VOCAB)
    off = encode_prompt(ASK, tok, VOCAB, template_kwargs={"enable_thinking": False})
    assert off[:len(on)] == on and tok.decode(off[len(on):]) == "<think>\n\n</think>\n\n"
    engine = Engine(tiny.make_llama(0, vocab_size=VOCAB), tok)
    assert engine.generate(ASK, max_tokens=3, chat_template_kwargs={"enable_thinking": False}).stats.prompt_tokens \
        == len(off)
    with pytest.raises(InvalidArgumentError, match="may not set tools"):
        engine.generate(ASK, chat_template_kwargs={"tools": []})
    with pytest.raises(InvalidArgumentError, match="chat_template_kwargs need a prompt of chat messages"):
        engine.generate("2 + 2?", chat_template_kwargs={"enable_thinking": False})


@pytest.fixture(scope="module")
def scripted():
    """A server per template whose model writes what a test gives it after the prompt."""
    def serve(template, **options):
        tok = tiny.make_tokenizer(template, added=THINKING)
        model = tiny.ScriptedModel(vocab=VOCAB)
        return tok, model, running_server(Engine(model, tok, drafter="ngram"), model_id="thinker", **options)
    return serve


def ask(url, **body):
    return httpx.post(f"{url}/v1/chat/completions", json=dict({"messages": ASK, "max_tokens": 80}, **body),
                      timeout=TIMEOUT)


def stream(url, **body):
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
                      json=dict({"messages": ASK, "max_tokens": 80, "stream": True}, **body)) as r:
        deltas = [c["choices"][0]["delta"] for c in iter_sse(r) if c and c.get("choices")]
    return "".join(d.get("reasoning", "") for d in deltas), "".join(d.get("content") or "" for d in deltas)


@pytest.mark.parametrize("template, says, reasoning", [
    (HYBRID, "<think>\nAdd them.\n</think>\n\nIt is 4.", "\nAdd them.\n"),
    (OPENING, "Add them.\n</think>\n\nIt is 4.", "Add them.\n"),
], ids=["the-model-opens-it", "the-template-opens-it"])
def test_the_reasoning_comes_apart_from_the_answer(scripted, template, says, reasoning):
    tok, model, server = scripted(template)
    with server as (url, _):
        model.say(tok.encode(says, add_special_tokens=False), len(encode_prompt(ASK, tok, VOCAB)))
        message = ask(url).json()["choices"][0]["message"]
        assert message["content"] == "It is 4." and message["reasoning"] == reasoning
        assert stream(url) == (reasoning, "It is 4.")


def test_a_thinking_model_s_plain_completion_keeps_its_text_whole(scripted):
    """/v1/completions continues a text, with no chat template to open or expect a block: its
    text is what the model wrote, markers and all."""
    tok, model, server = scripted(HYBRID)
    says, prompt = "<think>\nAdd them.\n</think>\n\nIt is 4.", "Q: What is 2 + 2?\nA:"
    with server as (url, _):
        model.say(tok.encode(says, add_special_tokens=False), len(encode_prompt(prompt, tok, VOCAB)))
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 80}, timeout=TIMEOUT).json()
    choice = r["choices"][0]
    assert choice["text"] == says and not any("reasoning" in key for key in choice)
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_a_model_that_does_not_think_has_no_reasoning_key(scripted):
    tok, model, server = scripted(HYBRID)
    with server as (url, _):
        model.say(tok.encode("It is 4.", add_special_tokens=False), len(encode_prompt(ASK, tok, VOCAB)))
        message = ask(url).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "It is 4."}


def test_the_server_s_template_args_and_a_request_s_own(scripted):
    tok, model, server = scripted(HYBRID, chat_template_args={"enable_thinking": False})
    on = len(encode_prompt(ASK, tok, VOCAB))
    off = len(encode_prompt(ASK, tok, VOCAB, template_kwargs={"enable_thinking": False}))
    with server as (url, _):
        model.say(tok.encode("It is 4.", add_special_tokens=False), off)
        r = ask(url).json()
        assert r["usage"]["prompt_tokens"] == off and r["choices"][0]["message"]["content"] == "It is 4."
        r = ask(url, chat_template_kwargs={"enable_thinking": True}).json()  # the request's own wins
        assert r["usage"]["prompt_tokens"] == on
        r = ask(url, chat_template_kwargs={"tokenize": True})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs"


def test_a_grammar_after_a_thinking_block_the_template_opened(scripted):
    """The model reasons freely (its reasoning leaves the grammar) and answers in the grammar."""
    tok, model, server = scripted(OPENING)
    end_text = [tiny.SPECIALS.index("<|im_end|>")]
    says = tok.encode("Add them: 2 + 2 = 4.</think>42", add_special_tokens=False) + end_text
    digits = {"type": "regex", "regex": "[0-9]+"}
    with server as (url, _):
        model.say(says, len(encode_prompt(ASK, tok, VOCAB)))
        r = ask(url, response_format=digits)
        assert r.status_code == 200, r.text
        message = r.json()["choices"][0]["message"]
        assert message == {"role": "assistant", "content": "42", "reasoning": "Add them: 2 + 2 = 4."}
        assert stream(url, response_format=digits) == ("Add them: 2 + 2 = 4.", "42")
        # after the block the grammar refuses the end of text the model wants: a digit comes first
        model.say(tok.encode("4</think>", add_special_tokens=False) + end_text, len(encode_prompt(ASK, tok, VOCAB)))
        r = ask(url, response_format={"type": "regex", "regex": "[0-9]"}).json()
        assert r["choices"][0]["message"]["content"] in list("0123456789")
    hybrid = Engine(tiny.make_llama(0, vocab_size=VOCAB), tiny.make_tokenizer(HYBRID, added=THINKING))
    r = hybrid.generate(ASK, response_format={"type": "regex", "regex": "[a-z]{3}"}, max_tokens=8)
    assert len(r.text) == 3 and r.text.isalpha()  # the model opens its blocks itself: the grammar keeps it from it
    hybrid.reset()
    r = hybrid.generate(ASK, response_format={"type": "regex", "regex": "[a-z]{3}"}, max_tokens=8,
                        chat_template_kwargs={"enable_thinking": False})
    assert len(r.text) == 3  # (the template closed an empty block: not inside one)


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
# Greedy, the block closes after 7 and 11 tokens; sampled with seed 4, after 26 and 25.
@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.8, "seed": 4}])
@pytest.mark.parametrize("seed, bias", [(0, 0.5), (1, 1.5)])
def test_speculation_after_thinking_is_the_gated_plain_decoding(drafter, options, seed, bias, tmp_path):
    target = tiny.make_llama(seed, vocab_size=VOCAB, tie_embeddings=False)
    kw = {}
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(seed, vocab_size=VOCAB, tie_embeddings=False)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    tok = tiny.make_tokenizer(OPENING, added=THINKING)
    engine = Engine(target, tok, drafter=drafter, **kw)
    end = tok.encode("</think>", add_special_tokens=False)[0]
    request = dict(max_tokens=40, logit_bias={end: bias}, response_format={"type": "regex", "regex": "[a-c]+"},
                   **options)
    plain = engine.generate(ASK, speculative=False, **request)
    engine.reset()
    fast = engine.generate(ASK, **request)
    assert fast.tokens == plain.tokens
    for r in (plain, fast):
        assert end in r.tokens
        reasoning, answer = r.text.split("</think>")
        assert re.fullmatch("[a-c]+", answer) and not re.fullmatch("[a-c]*", reasoning), r.text
    if drafter == "ngram" and options == {"num_draft": 3}:
        assert fast.stats.accepted > 0


def test_a_closing_marker_of_several_tokens_opens_the_grammar_once_whole():
    """Each prefix of a marker of several tokens, committed or drafted, leaves the block open."""
    tok = tiny.make_tokenizer()
    table = token_table(tok, tok.eos_token_ids)
    inner = Constraint(check_response_format({"type": "regex", "regex": "x+"}), table, tok.eos_token_ids, tiny.VOCAB)
    t = {ch: tok.encode(ch, add_special_tokens=False)[0] for ch in "</>ax"}
    gate = AfterThinking(inner, [t["<"], t["/"], t[">"]])
    assert gate.allowed([t["a"], t["<"], t["/"]]) == 3 and gate.forced() == []
    gate.commit([t["a"], t["<"]])
    rows = np.array(gate.rows([t["/"], t[">"], t["x"], t["a"]]))
    assert rows.shape == (5, tiny.VOCAB) and rows[:2].all()  # up to the marker's last token: anything
    assert np.nonzero(rows[2])[0].tolist() == [t["x"]]  # then the grammar's rows: x, then x or the end
    assert np.nonzero(rows[3])[0].tolist() == sorted([t["x"], *tok.eos_token_ids]) and rows[4].all()
    assert gate.allowed([t["/"], t[">"], t["x"], t["a"]]) == 3  # the grammar refuses "a" after it
    gate.commit([t["/"]])
    assert not gate.open
    gate.commit([t[">"]])
    assert gate.open and gate.allowed([t["a"]]) == 0 and gate.forced() == [t["x"]]


@pytest.mark.parametrize("key", ["reasoning_content", "none"])
def test_the_server_puts_the_reasoning_where_it_is_told(scripted, key):
    tok, model, server = scripted(HYBRID, reasoning_key=key)
    says = "<think>\nAdd them.\n</think>\n\nIt is 4."
    with server as (url, _):
        model.say(tok.encode(says, add_special_tokens=False), len(encode_prompt(ASK, tok, VOCAB)))
        message = ask(url).json()["choices"][0]["message"]
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": ASK, "max_tokens": 80, "stream": True}) as r:
            deltas = [c["choices"][0]["delta"] for c in iter_sse(r) if c and c.get("choices")]
    if key == "none":
        assert message == {"role": "assistant", "content": says}
        assert "".join(d.get("content") or "" for d in deltas) == says
    else:
        assert message == {"role": "assistant", "content": "It is 4.", key: "\nAdd them.\n"}
        assert "".join(d.get(key, "") for d in deltas) == "\nAdd them.\n"
    assert not any("reasoning" in d for d in deltas)


@pytest.mark.parametrize("key, counted", [("reasoning", 10), ("none", 0)])
def test_usage_counts_the_reasoning_s_tokens_where_it_is_split_off(scripted, key, counted):
    # OpenAI's completion_tokens_details.reasoning_tokens: "Add them.\n" is 10 byte tokens (the marker not
    # among them); 0 when the reasoning stays in the content
    tok, model, server = scripted(OPENING, reasoning_key=key)
    with server as (url, _):
        model.say(tok.encode("Add them.\n</think>\n\nIt is 4.", add_special_tokens=False),
                  len(encode_prompt(ASK, tok, VOCAB)))
        whole = ask(url, n=2).json()["usage"]
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": ASK, "max_tokens": 80, "n": 2, "stream": True,
                                "stream_options": {"include_usage": True}}) as r:
            streamed = [c for c in iter_sse(r) if c and c.get("usage")][-1]["usage"]
    details = {"reasoning_tokens": 2 * counted, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
               "audio_tokens": 0}  # both choices'
    assert whole["completion_tokens_details"] == streamed["completion_tokens_details"] == details


def test_reasoning_held_back_to_the_end_counts_its_own_tokens(scripted):
    # "</th" may begin the closing marker, so it is held back until the answer ends, then let out as
    # reasoning: its 4 byte tokens count with it, and nothing more ("Add them.\n" is 10 more)
    tok, model, server = scripted(OPENING)
    with server as (url, _):
        model.say(tok.encode("Add them.\n</th", add_special_tokens=False), len(encode_prompt(ASK, tok, VOCAB)))
        r = ask(url).json()
        with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=TIMEOUT,
                          json={"messages": ASK, "max_tokens": 80, "stream": True,
                                "stream_options": {"include_usage": True}}) as s:
            streamed = [c for c in iter_sse(s) if c and c.get("usage")][-1]["usage"]
    assert r["choices"][0]["message"]["reasoning"] == "Add them.\n</th" and r["choices"][0]["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 14 == \
        streamed["completion_tokens_details"]["reasoning_tokens"]


def test_an_unknown_reasoning_key_is_refused():
    from mlxspec.serve import ServeOptions
    from mlxspec.serve.app import make_app

    with pytest.raises(InvalidArgumentError, match="reasoning_key must be one of reasoning, reasoning_content, none"):
        make_app(Engine(tiny.make_llama(0), tiny.make_tokenizer()), ServeOptions(reasoning_key="thoughts"))


@pytest.mark.parametrize("template, says, reasoning", [
    (OPENING, "Add them.</think>It is 4. <", "Add them."),  # the template opened the block
    (HYBRID, "<think>Add them.</think>\n\nIt is 4. <", "Add them."),  # the model opens it
    (tiny.CHAT_TEMPLATE, "It is 4. <", ""),  # a thinking model that does not think this time
], ids=["the-template-opens-it", "the-model-opens-it", "no-thinking"])
@pytest.mark.parametrize("json_out", [False, True])
def test_generate_prints_the_answer_and_sends_the_reasoning_to_stderr(template, says, reasoning, json_out,
                                                                      monkeypatch, capsys):
    """`mlxspec generate` with a `<think>` model: the answer alone on stdout (the " <" at its end
    could have started a marker, so it is held back while streaming and printed at the end),
    the reasoning on stderr; --json gives both apart."""
    from types import SimpleNamespace

    from mlxspec.cli import main
    from mlxspec.commands import modelargs

    tok = tiny.make_tokenizer(template, added=THINKING)
    model = tiny.ScriptedModel(vocab=VOCAB)
    model.say(tok.encode(says, add_special_tokens=False) + [tiny.SPECIALS.index("<|im_end|>")],
              len(encode_prompt(ASK, tok, VOCAB)))
    engine = Engine(model, tok, drafter="ngram")
    engine.pair_name, engine.draft_info = None, None  # what `mlxspec.load` records (the command prints it)
    engine.target_info = SimpleNamespace(ref="thinker", weights_bytes=2**20, dtype="float32", quantization="none")
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    assert main(["generate", *(["--json"] if json_out else []), ASK[0]["content"]]) == 0
    out, err = capsys.readouterr()
    if json_out:
        result = json.loads(out)
        assert (result["text"], result["reasoning"]) == ("It is 4. <", reasoning)
    else:
        assert out == "It is 4. <\n" and "think>" not in out + err
        # stderr: the load line, the reasoning's lines if any, the stats line
        assert err.splitlines()[1:-1] == ([reasoning] if reasoning else [])


def test_generate_splits_where_the_template_variables_open_the_block(monkeypatch, capsys):
    """A template that opens the thinking block only when told to (a variable): the split starts
    inside it as the prompt rendered with --chat-template-args says."""
    from types import SimpleNamespace

    from mlxspec.cli import main
    from mlxspec.commands import modelargs

    template = tiny.CHAT_TEMPLATE + "{% if add_generation_prompt and think %}<think>\n{% endif %}"
    tok = tiny.make_tokenizer(template, added=THINKING)
    model = tiny.ScriptedModel(vocab=VOCAB)
    model.say(tok.encode("Add them.</think>It is 4.", add_special_tokens=False) + [tiny.SPECIALS.index("<|im_end|>")],
              len(encode_prompt(ASK, tok, VOCAB, template_kwargs={"think": True})))
    engine = Engine(model, tok, drafter="ngram")
    engine.pair_name, engine.draft_info = None, None
    engine.target_info = SimpleNamespace(ref="thinker", weights_bytes=2**20, dtype="float32", quantization="none")
    monkeypatch.setattr(modelargs, "load_engine", lambda args, **kw: engine)
    assert main(["generate", "--chat-template-args", '{"think": true}', ASK[0]["content"]]) == 0
    out, err = capsys.readouterr()
    assert out == "It is 4.\n" and err.splitlines()[1:-1] == ["Add them."]
