"""Fill in the middle (`suffix`): the model's own markers, its end-of-middle tokens, speculation
lossless, and the server's `suffix` through the official client."""

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.fim import fim_format
from serve_helpers import TIMEOUT, openai_client, running_server

QWEN = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>"]
CODESTRAL = ["[SUFFIX]", "[PREFIX]"]
PREFIX = "def area(r):\n    return "
SUFFIX = "\n\nprint(area(2.0))\n"


def qwen_tokenizer():
    return tiny.make_tokenizer(added=QWEN)


def ids_of(tok, names):
    return [tok.convert_tokens_to_ids(n) for n in names]


def test_the_markers_come_from_the_vocabulary_in_the_model_s_order():
    tok = qwen_tokenizer()
    fmt = fim_format(tok)
    pre, suf, mid, pad, sep = ids_of(tok, QWEN)
    body = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    assert fmt.encode(tok, PREFIX, SUFFIX) == [pre, *body(PREFIX), suf, *body(SUFFIX), mid]
    assert fmt.encode(tok, "", "") == [pre, suf, mid]
    assert {pad, sep, pre, suf, mid, tok.convert_tokens_to_ids("<|endoftext|>")} <= set(fmt.ends)
    spm = tiny.make_tokenizer(added=CODESTRAL)
    suffix_id, prefix_id = ids_of(spm, CODESTRAL)
    enc = lambda text: spm.encode(text, add_special_tokens=False)  # noqa: E731
    assert fim_format(spm).encode(spm, PREFIX, SUFFIX) == [suffix_id, *enc(SUFFIX), prefix_id, *enc(PREFIX)]
    assert fim_format(tiny.make_tokenizer()) is None


def test_the_middle_is_what_the_model_writes_there_and_ends_at_its_end_of_middle_token():
    tok = qwen_tokenizer()
    model = tiny.ScriptedModel(vocab=tiny.VOCAB + len(QWEN))
    engine = Engine(model, tok, drafter="ngram")
    prompt = fim_format(tok).encode(tok, PREFIX, SUFFIX)
    model.say(tok.encode("3.14159 * r * r", add_special_tokens=False) + ids_of(tok, ["<|file_sep|>"]) +
              tok.encode("junk", add_special_tokens=False), len(prompt))
    r = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=40)
    assert r.text == "3.14159 * r * r" and r.finish_reason == "stop" and r.stats.prompt_tokens == len(prompt)
    plain = engine.generate(PREFIX, max_tokens=5)  # without a suffix: an ordinary prompt
    assert plain.stats.prompt_tokens == len(tok.encode(PREFIX))


@pytest.mark.parametrize("drafter", ["none", "ngram", "model"])
@pytest.mark.parametrize("options", [{}, {"num_draft": 3}, {"temperature": 0.9, "seed": 2}])
def test_speculation_fills_in_the_middle_as_plain_decoding_does(drafter, options):
    vocab = tiny.VOCAB + len(QWEN)
    kw = {"draft_model": tiny.make_llama(0, vocab_size=vocab, tie_embeddings=False)} if drafter == "model" else {}
    engine = Engine(tiny.make_llama(0, vocab_size=vocab, tie_embeddings=False), qwen_tokenizer(), drafter=drafter, **kw)
    plain = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=48, speculative=False, **options)
    engine.reset()
    fast = engine.generate(PREFIX, suffix=SUFFIX, max_tokens=48, **options)
    assert fast.tokens == plain.tokens


@pytest.mark.parametrize("kwargs, says", [
    ({"prompt": PREFIX, "suffix": 3}, "suffix must be a string"),
    ({"prompt": [5, 6], "suffix": "x"}, "suffix needs a string prompt"),
    ({"prompt": [{"role": "user", "content": "hi"}], "suffix": "x"}, "suffix needs a string prompt.*got a chat"),
    ({"prompt": [5, 6], "suffix": "x"}, "got a token-id prompt"),
    ({"prompt": PREFIX, "suffix": "\ud800"}, "suffix is not valid Unicode"),
    ({"prompt": PREFIX, "suffix": "x", "chat_template_kwargs": {"a": 1}}, "need chat messages; send one or the other"),
    ({"prompt": PREFIX, "suffix": "x", "continue_final_message": True}, "need chat messages; send one or the other"),
])
def test_bad_suffixes_are_refused(kwargs, says):
    engine = Engine(tiny.make_llama(0, vocab_size=tiny.VOCAB + len(QWEN)), qwen_tokenizer())
    with pytest.raises(InvalidArgumentError, match=says):
        engine.generate(max_tokens=2, **kwargs)


def test_markers_beyond_the_model_s_vocabulary_are_refused():
    """A tokenizer whose added markers the model has no rows for (a mismatched pair)."""
    tok = qwen_tokenizer()
    first = ids_of(tok, QWEN[:1])[0]  # the prompt's first marker, the vocabulary's first id past the model's rows
    assert first == tiny.VOCAB
    engine = Engine(tiny.make_llama(0, vocab_size=tiny.VOCAB), tok)
    with pytest.raises(InvalidArgumentError, match=rf"marker id {first} is outside the model's vocabulary \[0, {first}\)"):
        engine.generate(PREFIX, suffix=SUFFIX, max_tokens=2)


def test_a_model_without_markers_is_refused_saying_why():
    engine = Engine(tiny.make_llama(0), tiny.make_tokenizer())
    with pytest.raises(InvalidArgumentError, match="no fill-in-the-middle markers"):
        engine.generate(PREFIX, suffix=SUFFIX, max_tokens=2)


def area_coder() -> Engine:
    """A code model that fills PREFIX ... SUFFIX with "3.14159 * r * r", then its end of middle."""
    tok = qwen_tokenizer()
    model = tiny.ScriptedModel(vocab=tiny.VOCAB + len(QWEN))
    model.say(tok.encode("3.14159 * r * r", add_special_tokens=False) + ids_of(tok, ["<|fim_pad|>"]),
              len(fim_format(tok).encode(tok, PREFIX, SUFFIX)))
    return Engine(model, tok, drafter="ngram")


def test_the_server_s_suffix_through_the_official_client():
    with running_server(area_coder(), model_id="coder") as (url, _):
        client = openai_client(url)
        r = client.completions.create(model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=40)
        assert r.choices[0].text == "3.14159 * r * r" and r.choices[0].finish_reason == "stop"
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="coder", prompt=PREFIX, suffix=SUFFIX, max_tokens=40, stream=True) if c.choices)
        assert streamed == "3.14159 * r * r"
        r = httpx.post(f"{url}/v1/completions", json={"prompt": [1, 2], "suffix": "x"}, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix", r.text
    with running_server(Engine(tiny.make_llama(0), tiny.make_tokenizer()), model_id="chat") as (url, _):
        r = httpx.post(f"{url}/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX}, timeout=TIMEOUT)
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix", r.text
        assert "no fill-in-the-middle markers" in r.json()["error"]["message"]
