"""Logprobs: every drafter, chain, tree and sampled round reports the target's own log-probabilities."""

import httpx
import mlx.core as mx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt
from serve_helpers import TIMEOUT, openai_client, running_server, tiny_engine

ASK = [{"role": "user", "content": "Tell me a long story about rivers and the sea, again and again."}]
TOP = 4


def engine_for(drafter, tmp_path, **kw):
    target = tiny.make_llama(0, tie_embeddings=False)
    if drafter == "model":
        kw["draft_model"] = tiny.make_llama(1, layers=1, tie_embeddings=False)
    if drafter == "eagle":
        kw["eagle_head"] = tiny.make_eagle_head(target, tmp_path / "head")
    return Engine(target, tiny.make_tokenizer(), drafter=drafter, **kw), target


def reference(target, ids, tokens):
    """The target's log-softmax, teacher-forced over the prompt and the answer: (S, V) rows of the answer."""
    logits = target(mx.array(ids + tokens)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    return lp[len(ids) - 1: len(ids) - 1 + len(tokens)]


@pytest.mark.parametrize("drafter", ["none", "ngram", "model", "eagle"])
@pytest.mark.parametrize("options", [{}, {"tree": "off", "num_draft": 3}, {"temperature": 0.9, "seed": 5},
                                     {"temperature": 0.9, "seed": 5, "num_draft": 3}])
def test_each_token_s_logprob_is_the_target_s_own(drafter, options, tmp_path):
    engine, target = engine_for(drafter, tmp_path)
    r = engine.generate(ASK, max_tokens=40, logprobs=TOP, **options)
    ids = encode_prompt(ASK, engine.tokenizer, engine.vocab_size)
    ref = reference(target, ids, r.tokens)
    tol = tiny.float32_tol(1e-4) * 10  # log-softmax of logits of magnitude ~10
    got = mx.array(r.logprobs)
    want = mx.take_along_axis(ref, mx.array(r.tokens)[:, None], axis=-1)[:, 0]
    assert mx.allclose(got, want, atol=tol).item(), mx.abs(got - want).max().item()
    best = mx.sort(ref, axis=-1)[:, ::-1][:, :TOP]  # the true top choices' values, best first
    for i, top in enumerate(r.top_logprobs):
        assert len(top) == TOP and [t for t, _ in top] == sorted(set(t for t, _ in top), key=[t for t, _ in top].index)
        assert mx.allclose(mx.array([v for _, v in top]), best[i], atol=tol).item()
        assert all(abs(ref[i, t].item() - v) <= tol for t, v in top)
    if drafter != "none" and "num_draft" in options and (drafter == "model" or "temperature" not in options):
        assert r.stats.accepted > 0  # drafts were accepted, so rows past the first were read


def test_with_a_window_they_are_plain_decoding_s(tmp_path):
    engine, _ = engine_for("ngram", tmp_path, max_kv_size=48)
    plain = engine.generate(ASK, max_tokens=60, logprobs=0, speculative=False)
    engine.reset()
    fast = engine.generate(ASK, max_tokens=60, logprobs=0)
    assert fast.tokens == plain.tokens and fast.stats.rounds < len(fast.tokens)
    assert mx.allclose(mx.array(fast.logprobs), mx.array(plain.logprobs), atol=tiny.float32_tol() * 10).item()
    assert all(top == [] for top in fast.top_logprobs)


def test_without_logprobs_nothing_is_computed_or_reported(tmp_path):
    engine, _ = engine_for("ngram", tmp_path)
    r = engine.generate(ASK, max_tokens=8)
    assert r.logprobs is None and r.top_logprobs is None
    assert all(ev.logprob is None and ev.top_logprobs is None for ev in engine.stream(ASK, max_tokens=4))


@pytest.mark.parametrize("bad", [-1, 1001, True, 1.5, "3"])
def test_bad_logprobs_are_refused(bad, tmp_path):
    engine, _ = engine_for("none", tmp_path)
    with pytest.raises(InvalidArgumentError, match=r"logprobs must be None \(off\) or an integer in 0..1000"):
        engine.generate(ASK, logprobs=bad)


# -- through the server --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served():
    engine = tiny_engine()
    with running_server(engine, model_id="t") as (url, _):
        yield url, engine


def test_chat_logprobs_through_the_openai_client(served):
    url, engine = served
    client = openai_client(url)
    r = client.chat.completions.create(model="t", messages=ASK, max_tokens=12, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    expected = engine.generate(ASK, max_tokens=12, logprobs=2)
    assert [c.logprob for c in content] == pytest.approx(expected.logprobs, abs=1e-5)
    assert all(len(c.top_logprobs) == 2 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    assert "".join(c.token for c in content) == r.choices[0].message.content
    chunks = list(client.chat.completions.create(model="t", messages=ASK, max_tokens=12, logprobs=True,
                                                 top_logprobs=2, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [c.logprob for c in streamed] == pytest.approx(expected.logprobs, abs=1e-5)
    plain = client.chat.completions.create(model="t", messages=ASK, max_tokens=4)
    assert plain.choices[0].logprobs is None
    bare = client.chat.completions.create(model="t", messages=ASK, max_tokens=12, logprobs=True).choices[0]
    assert [c.logprob for c in bare.logprobs.content] == pytest.approx(expected.logprobs, abs=1e-5)
    assert all(c.top_logprobs == [] for c in bare.logprobs.content)  # no top_logprobs: no alternatives (OpenAI's)


def test_completion_logprobs_in_the_legacy_shape(served):
    url, engine = served
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 6, "logprobs": 3},
                   timeout=TIMEOUT).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == r["usage"]["completion_tokens"]
    assert lp["text_offset"][0] == len("Once upon a time") and lp["text_offset"] == sorted(lp["text_offset"])
    expected = engine.generate("Once upon a time", max_tokens=6, logprobs=3)
    assert lp["token_logprobs"] == pytest.approx(expected.logprobs, abs=1e-5)
    assert all(1 <= len(top) <= 4 for top in lp["top_logprobs"])  # tokens that print alike share a key
    for name, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert top[name] == pytest.approx(value, abs=1e-5)  # the token itself, as OpenAI's "up to logprobs + 1"
    sampled = httpx.post(f"{url}/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 24, "logprobs": 1,
                                                        "temperature": 2.0, "seed": 3}, timeout=TIMEOUT).json()
    lp = sampled["choices"][0]["logprobs"]
    assert all(top[name] == value for name, value, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]))
    assert any(len(top) == 2 for top in lp["top_logprobs"])  # at T = 2 some tokens drawn are not the best


def test_served_logprobs_spell_the_text_byte_for_byte():
    """Tokens held back by a stop string, or past the end, are not reported; part-characters keep their bytes."""
    tok = tiny.make_tokenizer()
    model = tiny.ScriptedModel()
    engine = Engine(model, tok, drafter="ngram")
    text = "Café ☕ ok STOP more"
    messages = [{"role": "user", "content": "say it"}]
    model.say(tok.encode(text, add_special_tokens=False), len(encode_prompt(messages, tok, tiny.VOCAB)))
    with running_server(engine, model_id="s") as (url, _):
        client = openai_client(url)
        for stop in (["STOP"], None):
            kept = "Café ☕ ok " if stop else text
            r = client.chat.completions.create(model="s", messages=messages, max_tokens=40, stop=stop, logprobs=True,
                                               top_logprobs=2)
            content = r.choices[0].logprobs.content
            assert r.choices[0].message.content == kept
            assert b"".join(bytes(c.bytes) for c in content) == kept.encode()  # no <|im_end|>, no STOP
            assert any(c.token == "\ufffd" and len(c.bytes) == 1 for c in content)  # a byte of é or ☕
            streamed = [c for ch in client.chat.completions.create(
                model="s", messages=messages, max_tokens=40, stop=stop, logprobs=True, stream=True)
                if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
            assert b"".join(bytes(c.bytes) for c in streamed) == kept.encode()
        prompt = tok.decode(encode_prompt(messages, tok, tiny.VOCAB))
        r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 40, "stop": ["STOP"],
                                                      "logprobs": 3}, timeout=TIMEOUT).json()
        lp, kept = r["choices"][0]["logprobs"], r["choices"][0]["text"]
        assert kept == "Café ☕ ok "
        assert [t for t in lp["tokens"] if t.startswith("bytes:")] == ["bytes:\\xc3", "bytes:\\xa9", "bytes:\\xe2",
                                                                          "bytes:\\x98", "bytes:\\x95"]
        # each token's offset is the character it starts in, counted from the prompt's start (OpenAI's)
        assert lp["text_offset"] == [len(prompt) + i for i in (0, 1, 2, 3, 3, 4, 5, 5, 5, 6, 7, 8, 9)]
        assert all(lp["token_logprobs"][i] == pytest.approx(max(top.values())) for i, top in
                   enumerate(lp["top_logprobs"]))  # the chosen token is the best, and never overwritten


def test_the_byte_alphabet_is_gpt2_s():
    """Byte-level BPE's printable stand-ins for the 256 bytes, as its tokenizers write them."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from mlxspec.logprobs import BYTE_DECODER

    assert BYTE_DECODER == {char: byte for byte, char in bytes_to_unicode().items()}


def test_a_token_that_is_part_of_a_character_is_spelled_by_its_piece():
    """Decoded alone such a token is U+FFFD: its bytes come from the vocabulary piece instead."""
    from types import SimpleNamespace

    from mlxspec.logprobs import token_bytes

    def tokenizer(pieces):
        return SimpleNamespace(decode=lambda ids: "\ufffd" if pieces[ids[0]] != "ok" else "ok",
                               convert_ids_to_tokens=lambda i: pieces[i])

    sentencepiece = tokenizer({0: "<0xE2>", 1: "<0x0a>", 2: "ok", 3: "\u2581"})  # (3: no byte spelling: kept)
    assert [token_bytes(sentencepiece, i) for i in range(4)] == [b"\xe2", b"\n", b"ok", "\ufffd".encode()]
    byte_level = tokenizer({0: "âĢ", 1: "Ġ", 2: "\u2581Ġ"})  # GPT-2's stand-ins for 0xE2 0x80, and for a space
    assert [token_bytes(byte_level, i) for i in range(3)] == [b"\xe2\x80", b" ", "\ufffd".encode()]
