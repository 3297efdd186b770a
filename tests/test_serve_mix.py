"""A seeded random mix of requests, valid and not, against a real server: each gets a 200 or a 400
in its API's error shape, streams end as their API ends them, and the server keeps answering."""

import json
import random
from collections import Counter

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from serve_helpers import running_server

REQUESTS = 200
WEIRD = [None, True, False, 0, -1, 1, 3.5, 1e30, "", "x", "auto", [], {}, [1, 2], {"a": 1}, "\u0000", 10**20]
GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
ROUTES = ["/v1/chat/completions"] * 4 + ["/v1/completions"] * 2 + ["/v1/responses", "/v1/messages", "/tokenize",
                                                                   "/detokenize"]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
# Each field's plausible values; a "careless" request also gets WEIRD ones.
FIELDS = {
    "max_tokens": [1, 5, 12], "max_completion_tokens": [3, 9], "temperature": [0, 0.5, 1.0, 2.0],
    "top_p": [0.5, 1.0], "top_k": [0, 5], "min_p": [0.0, 0.1], "seed": [0, 7, 99], "n": [1, 2, 3],
    "typical_p": [0.5, 1.0], "top_n_sigma": [-1, 1.0], "xtc_probability": [0.0, 0.5], "xtc_threshold": [0.05, 0.1],
    "mirostat": [0, 2],
    "dry_multiplier": [0.0, 0.8], "dry_sequence_breakers": [["\n"], '"\\n", ":"'],
    "stop": ["a", ["a", "b"], []], "logprobs": [True, False], "top_logprobs": [0, 2, 4],
    "presence_penalty": [0.5], "frequency_penalty": [0.5, -0.5], "repetition_penalty": [1.1],
    "logit_bias": [{"5": 10, "7": -100}], "stream_options": [{"include_usage": True}],
    "response_format": [{"type": "json_object"}, {"type": "text"}, SCHEMA], "tools": [TOOLS],
    "tool_choice": ["auto", "none", "required", {"type": "function", "function": {"name": "f"}}],
    "speculative": [True, False], "num_draft": ["auto", 0, 3], "tree": ["auto", "off", 4], "lookup": [True, False],
    "drafter": ["model", "ngram", "none"], "echo": [True], "suffix": ["end"], "best_of": [2], "user": ["u"],
    "model": ["s", "another"], "include": [["message.output_text.logprobs"], [], ["reasoning.encrypted_content"]],
}


class Mix:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.careless = False

    def pick(self, values):
        return self.rng.choice(WEIRD) if self.careless and self.rng.random() < 0.4 else self.rng.choice(values)

    def text(self):
        return self.pick(["hi", "Hello there", "say a b c", "😀", "a\nb"])

    def message(self):
        roles = ["user", "assistant", "system", "developer", "tool", "bogus"] if self.careless else ["user"]
        m = {"role": self.rng.choice(roles),
             "content": self.pick(["hi", "Hello there", [{"type": "text", "text": "x"}]])}
        if m["role"] == "assistant" and self.rng.random() < 0.3:
            m["tool_calls"] = [{"id": "c1", "type": "function",
                                "function": {"name": "f", "arguments": self.pick(['{"a": 1}', "{bad"])}}]
        if m["role"] == "tool":
            m["tool_call_id"] = self.pick(["c1"])
        return m

    def body(self, route: str) -> dict:
        self.careless = self.rng.random() < 0.4
        rng, b = self.rng, {}
        if route == "/v1/chat/completions":
            b["messages"] = [self.message() for _ in range(rng.randrange(1, 4))]
        elif route == "/v1/completions":
            b["prompt"] = self.pick([self.text(), [self.text(), self.text()], [5, 6, 7], [[5, 6], [7]]])
        elif route == "/v1/responses":
            b["input"] = self.pick([self.text(), [self.message()]])
            if rng.random() < 0.3:
                b["max_output_tokens"] = self.pick([5, 9])
        elif route == "/v1/messages":
            b["messages"] = [self.message() for _ in range(rng.randrange(1, 3))]
            b["max_tokens"] = self.pick([5, 10])
        elif route == "/tokenize":
            return rng.choice([{"prompt": self.text()}, {"messages": [self.message()]}, {}])
        elif route == "/detokenize":
            return {"tokens": self.pick([[5, 6, 7], [10**9], [-1]])}
        for name, values in FIELDS.items():
            if rng.random() < 0.12:
                b[name] = self.pick(values)
        if rng.random() < 0.4:
            b["stream"] = self.pick([True, False])
        if route != "/v1/messages" and not {"max_tokens", "max_completion_tokens", "max_output_tokens"} & set(b):
            b["max_output_tokens" if route == "/v1/responses" else "max_tokens"] = rng.randrange(1, 16)
        return b


def check_answer(route: str, body: dict, status: int, text: str) -> None:
    said = f"{route} {json.dumps(body)[:300]} -> {status} {text[-300:]}"
    assert status in (200, 400), said
    if status == 400:
        error = json.loads(text)["error"]  # OpenAI's shape, and Anthropic's ({"type": "error", "error": ...})
        assert isinstance(error["message"], str) and error["message"] and error["type"], said
        return
    if body.get("stream") is not True:
        doc = json.loads(text)
        assert not (isinstance(doc, dict) and doc.get("error")), said
        return
    if route in ("/v1/chat/completions", "/v1/completions"):
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, said
    elif route == "/v1/responses":
        last = text.rstrip().rsplit("event: ", 1)[-1]  # at max_output_tokens, OpenAI's ends "incomplete"
        assert last.startswith(("response.completed", "response.incomplete")) and "event: error" not in text, said
    elif route == "/v1/messages":
        assert text.rstrip().rsplit("event: ", 1)[-1].startswith("message_stop") and "event: error" not in text, said


@pytest.mark.parametrize("seed", [1, 2])
def test_a_mix_of_requests_valid_and_not_gets_answers_never_a_crash(seed):
    target = tiny.make_llama(0, tie_embeddings=False)
    engine = Engine(target, tiny.make_tokenizer(tiny.TOOLS_TEMPLATE),
                    draft_model=tiny.make_llama(1, layers=1, tie_embeddings=False))
    mix, statuses = Mix(seed), Counter()
    with running_server(engine, model_id="s") as (url, _), httpx.Client(base_url=url, timeout=60) as client:
        for _ in range(REQUESTS):
            route = mix.rng.choice(ROUTES)
            body = mix.body(route)
            if body.get("stream") is True:
                with client.stream("POST", route, json=body) as r:
                    status, text = r.status_code, "".join(r.iter_text())
            else:
                r = client.post(route, json=body)
                status, text = r.status_code, r.text
            check_answer(route, body, status, text)
            statuses[route in GENERATING, status] += 1
        assert client.get("/health").status_code == 200
        last = client.post("/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert last.status_code == 200 and last.json()["usage"]["completion_tokens"] >= 1
    assert statuses[True, 200] >= REQUESTS // 5 and statuses[True, 400] >= REQUESTS // 10, statuses  # both kinds ran
