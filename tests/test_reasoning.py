"""A thinking model's reasoning: split from its answer in the server's chat answers (mlx-lm's
`reasoning` key), streamed or not, and chat_template_kwargs (e.g. enable_thinking) for its template."""

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
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


def test_a_grammar_inside_a_thinking_block_the_template_opened_is_refused():
    """The grammar would apply from the first token, inside the block: said, with what to send instead."""
    schema = {"type": "json_object"}
    opening = Engine(tiny.make_llama(0, vocab_size=VOCAB), tiny.make_tokenizer(OPENING, added=THINKING))
    with pytest.raises(InvalidArgumentError, match=r"response_format: this model's chat template opens a thinking "
                                                   r"block \(<think>\).*enable_thinking"):
        opening.stream(ASK, response_format=schema)
    hybrid = Engine(tiny.make_llama(0, vocab_size=VOCAB), tiny.make_tokenizer(HYBRID, added=THINKING))
    r = hybrid.generate(ASK, response_format={"type": "regex", "regex": "[a-z]{3}"}, max_tokens=8)
    assert len(r.text) == 3 and r.text.isalpha()  # the model opens its blocks itself: the grammar keeps it from it
    hybrid.reset()
    r = hybrid.generate(ASK, response_format={"type": "regex", "regex": "[a-z]{3}"}, max_tokens=8,
                        chat_template_kwargs={"enable_thinking": False})
    assert len(r.text) == 3  # (the template closed an empty block: not inside one)
