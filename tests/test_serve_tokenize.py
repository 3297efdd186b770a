"""POST /tokenize and /detokenize: the engine's own encoding of prompts and chats, and back."""

import httpx
import pytest

from mlxspec.prompts import encode_prompt
from serve_helpers import TIMEOUT, running_server, tiny_engine

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]


@pytest.fixture(scope="module")
def served():
    engine = tiny_engine()
    with running_server(engine, model_id="t", api_key="k") as (url, _):
        yield url, engine


def post(url, path, body, key="k"):
    """POST `body`: an object sent as JSON, or a string sent as the JSON text it is."""
    sent = {"content": body} if isinstance(body, str) else {"json": body}
    return httpx.post(f"{url}{path}", **sent, headers={"Authorization": f"Bearer {key}"}, timeout=TIMEOUT)


def test_a_prompt_and_a_chat_are_the_ids_the_engine_generates_from(served):
    url, engine = served
    r = post(url, "/tokenize", {"model": "t", "prompt": "Once upon a time"}).json()
    want = encode_prompt("Once upon a time", engine.tokenizer, engine.vocab_size)
    assert r == {"count": len(want), "max_model_len": engine.context, "tokens": want, "token_strs": None}
    r = post(url, "/tokenize", {"messages": CHAT, "return_token_strs": True}).json()
    want = encode_prompt(CHAT, engine.tokenizer, engine.vocab_size)
    assert r["tokens"] == want and r["count"] == len(want)
    assert r["token_strs"] == engine.tokenizer.convert_ids_to_tokens(want)
    completion = post(url, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}).json()
    assert completion["usage"]["prompt_tokens"] == r["count"]  # what a request of it counts
    prefilled = CHAT + [{"role": "assistant", "content": "The Danube"}]
    r = post(url, "/tokenize", {"messages": prefilled, "continue_final_message": True,
                                "add_generation_prompt": False}).json()
    assert r["tokens"] == encode_prompt(prefilled, engine.tokenizer, engine.vocab_size, continue_final=True)
    assert post(url, "/tokenize", {"content": "abc"}).json()["tokens"] == \
        encode_prompt("abc", engine.tokenizer, engine.vocab_size)  # llama.cpp's field


def test_detokenize_gives_the_text_back(served):
    url, engine = served
    ids = post(url, "/tokenize", {"prompt": "Café ☕ ok", "add_special_tokens": False}).json()["tokens"]
    r = post(url, "/detokenize", {"tokens": ids}).json()
    assert r == {"prompt": "Café ☕ ok", "content": "Café ☕ ok"}
    assert post(url, "/detokenize", {"tokens": []}).json()["prompt"] == ""


def test_llama_cpp_s_content_takes_its_defaults_and_gives_pieces():
    """llama.cpp's /tokenize: no BOS unless add_special, special tokens' text read as theirs unless
    parse_special is false, and with_pieces' tokens as {"id", "piece"}, a piece the token's text or,
    where its bytes are part of a character, those bytes. vLLM's `prompt` keeps its defaults."""
    from tokenizers import processors

    engine = tiny_engine()
    fast = engine.tokenizer._tokenizer  # a tokenizer that starts text with a BOS (id 0), as Llama's does
    fast._tokenizer.post_processor = processors.TemplateProcessing(single="<|endoftext|> $A",
                                                                   special_tokens=[("<|endoftext|>", 0)])
    with running_server(engine, model_id="t") as (url, _):
        def tokens(**body):
            r = httpx.post(f"{url}/tokenize", json=body, timeout=TIMEOUT)
            assert r.status_code == 200, r.text
            return r.json()["tokens"]

        text = "ok <|im_start|>"
        plain = engine.tokenizer.encode(text, add_special_tokens=False)
        assert plain[-1] == 1 and 0 not in plain  # <|im_start|> is read as itself
        assert tokens(content=text) == plain
        assert tokens(content=text, add_special=True) == [0] + plain
        assert tokens(prompt=text) == [0] + plain and tokens(prompt=text, add_special_tokens=False) == plain
        assert tokens(prompt="") == tokens(content="", add_special=True) == []  # nothing to count, not an error
        split = tokens(content=text, parse_special=False)
        assert 1 not in split and engine.tokenizer.decode(split) == text
        ok = engine.tokenizer.encode("ok é", add_special_tokens=False)
        assert tokens(content="ok é", with_pieces=True) == [  # the byte tokenizer: é is two tokens
            {"id": ok[0], "piece": "o"}, {"id": ok[1], "piece": "k"}, {"id": ok[2], "piece": " "},
            {"id": ok[3], "piece": [0xC3]}, {"id": ok[4], "piece": [0xA9]}]


@pytest.mark.parametrize("path, body, param, says", [
    ("/tokenize", {}, "prompt", "send one of prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt", "send one of prompt"),
    ("/tokenize", {"prompt": 5}, "prompt", "prompt must be a string"),
    ("/tokenize", {"content": 5}, "content", "content must be a string"),  # llama.cpp's name for it
    ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens", "true or false"),
    ("/tokenize", {"content": "a", "add_special": 1}, "add_special", "add_special must be true or false"),
    ("/tokenize", {"content": "a", "parse_special": "no"}, "parse_special", "parse_special must be true or false"),
    ("/tokenize", {"content": "a", "with_pieces": "yes"}, "with_pieces", "with_pieces must be true or false"),
    ("/tokenize", '{"prompt": "a\\ud800"}', "prompt", "not valid Unicode text"),  # JSON text: a lone surrogate
    ("/tokenize", '{"content": "a\\ud800"}', "content", "content is not valid Unicode text"),
    ("/apply-template", {}, "messages", "messages is required"),
    ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "must be one of"),
    ("/tokenize", {"messages": CHAT, "add_generation_prompt": False}, "add_generation_prompt", "not supported"),
    ("/tokenize", {"messages": CHAT, "chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs",
     "may not set"),  # the field named as /v1/chat/completions names it
    ("/tokenize", {"messages": CHAT, "tools": [{"type": "function"}]}, "tools", "tools[0]"),
    ("/detokenize", {"tokens": [1, "a"]}, "tokens", "list of token ids"),
    ("/detokenize", {"tokens": [10 ** 6]}, "tokens", "outside the vocabulary"),
])
def test_bad_bodies_are_400_naming_the_field(served, path, body, param, says):
    r = post(served[0], path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"], error


def test_the_api_key_guards_them_too(served):
    assert post(served[0], "/tokenize", {"prompt": "a"}, key="wrong").status_code == 401
    assert post(served[0], "/detokenize", {"tokens": [5]}, key="wrong").status_code == 401


def test_the_base_url_says_what_is_served_without_a_key(served):
    url, _ = served
    r = httpx.get(f"{url}/", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["model"] == "t" and "POST /v1/messages" in r.json()["routes"]
    assert httpx.head(f"{url}/", timeout=TIMEOUT).status_code == 200  # as Claude Code probes it
