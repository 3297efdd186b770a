"""The Responses API's input items through the official client: GET /v1/responses/{id}/input_items
(ids, typed content, OpenAI's pages), stored items referred to by id in a later input (Codex's
`item_reference`), their errors, and input items kept across a restart."""

import json

import httpx
import pytest

from mlxspec.serve import response_items
from serve_helpers import TIMEOUT, openai_client, running_server, scripted_server, tiny_engine
from test_serve_responses import CHAT_WEATHER, PARIS, WEATHER

SENT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Tell me"},
                                     {"type": "input_text", "text": "more"}]},
        {"type": "message", "role": "assistant", "content": "About what?"},
        {"type": "message", "role": "user", "content": "Rivers.", "id": "msg_mine"}]


@pytest.fixture(scope="module")
def served():
    with running_server(tiny_engine(drafter="ngram"), model_id="t") as (url, _):
        yield url, tiny_engine()


def test_input_items_are_what_the_request_sent_with_ids(served):
    url, _ = served
    client = openai_client(url)
    r = client.responses.create(model="t", input="Tell me about rivers.", max_output_tokens=2)
    (item,) = client.responses.input_items.list(r.id)
    assert item.type == "message" and item.role == "user" and item.id.startswith("msg_")
    assert [(c.type, c.text) for c in item.content] == [("input_text", "Tell me about rivers.")]
    r = client.responses.create(model="t", input=SENT, max_output_tokens=2)
    items = list(client.responses.input_items.list(r.id, order="asc"))
    assert [i.role for i in items] == ["system", "user", "assistant", "user"]
    assert items[-1].id == "msg_mine" and len({i.id for i in items}) == 4  # the client's id kept, others made
    assert [c.text for c in items[1].content] == ["Tell me", "more"]
    assert [(c.type, c.text) for c in items[2].content] == [("output_text", "About what?")]  # an assistant's
    assert [i.id for i in client.responses.input_items.list(r.id)] == [i.id for i in reversed(items)]  # newest first


def test_pages_follow_openais_cursors(served):
    url, _ = served
    client = openai_client(url)
    r = client.responses.create(model="t", input=SENT, max_output_tokens=2)
    ids = [i.id for i in client.responses.input_items.list(r.id, order="asc")]
    first = client.responses.input_items.list(r.id, order="asc", limit=3)
    assert [i.id for i in first.data] == ids[:3] and first.has_more and first.last_id == ids[2]
    rest = client.responses.input_items.list(r.id, order="asc", limit=3, after=first.last_id)
    assert [i.id for i in rest.data] == ids[3:] and not rest.has_more
    # `before` (in OpenAI's reference, not in this client's signature) pages back
    back = httpx.get(f"{url}/v1/responses/{r.id}/input_items", params={"order": "asc", "limit": 2, "before": ids[3]},
                     timeout=TIMEOUT).json()
    assert [i["id"] for i in back["data"]] == ids[1:3] and back["has_more"]
    # the client's own paging walks every page (limit 1: four requests)
    assert [i.id for i in client.responses.input_items.list(r.id, limit=1)] == ids[::-1]


@pytest.mark.parametrize("query,param", [("limit=0", "limit"), ("limit=101", "limit"), ("limit=two", "limit"),
                                         ("order=up", "order"), ("after=msg_nope", "after"),
                                         ("before=msg_nope", "before")])
def test_bad_list_queries_are_400_naming_the_parameter(served, query, param):
    url, _ = served
    r = openai_client(url).responses.create(model="t", input="Hi", max_output_tokens=1)
    got = httpx.get(f"{url}/v1/responses/{r.id}/input_items?{query}", timeout=TIMEOUT)
    assert got.status_code == 400 and got.json()["error"]["param"] == param
    assert httpx.get(f"{url}/v1/responses/resp_nope/input_items", timeout=TIMEOUT).status_code == 404


def test_a_stored_item_referred_to_by_id_is_the_item_itself(served):
    """Codex sends earlier items as references: the answer is the one to the items written out."""
    url, ref = served
    client = openai_client(url)
    first = client.responses.create(model="t", input="Tell me about rivers.", max_output_tokens=6)
    (asked,) = client.responses.input_items.list(first.id)
    turn = [{"type": "item_reference", "id": asked.id}, {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "And the sea?"}]
    r = client.responses.create(model="t", input=turn, max_output_tokens=6)
    chat = [{"role": "user", "content": "Tell me about rivers."}, {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And the sea?"}]
    assert r.output_text == ref.generate(chat, max_tokens=6).text
    listed = list(client.responses.input_items.list(r.id, order="asc"))
    assert [i.id for i in listed[:2]] == [asked.id, first.output[0].id]  # the items, not the references
    bad = httpx.post(f"{url}/v1/responses", json={"model": "t", "input": turn[:1] + [
        {"type": "item_reference", "id": "fc_nope"}]}, timeout=TIMEOUT)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"
    assert "fc_nope" in bad.json()["error"]["message"]


def test_a_referred_function_call_is_the_call():
    with scripted_server() as (url, say):
        check_a_referred_call(url, say)


def check_a_referred_call(url, say):
    client = openai_client(url)
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    say(PARIS, ask, [CHAT_WEATHER])
    (call,) = client.responses.create(model="s", input=ask, tools=[WEATHER], max_output_tokens=100).output
    as_chat = ask + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "Sunny, 24 C"}]
    say("It is sunny in Paris.", as_chat, [CHAT_WEATHER])
    r = client.responses.create(model="s", tools=[WEATHER], max_output_tokens=100, input=ask + [
        {"type": "item_reference", "id": call.id},
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 24 C"}])
    assert r.output_text == "It is sunny in Paris."
    kinds = [(i.type, getattr(i, "call_id", None)) for i in client.responses.input_items.list(r.id, order="asc")]
    assert kinds == [("message", None), ("function_call", call.call_id), ("function_call_output", call.call_id)]


def test_input_items_outlive_the_server(tmp_path):
    folder = tmp_path / "responses"
    with running_server(tiny_engine(drafter="ngram"), model_id="t", responses_dir=str(folder)) as (url, _):
        first = openai_client(url).responses.create(model="t", input=SENT, max_output_tokens=2)
        ids = [i.id for i in openai_client(url).responses.input_items.list(first.id)]
    old = folder / "resp_old.json"  # a file stored before input items were kept
    data = json.loads((folder / f"{first.id}.json").read_text())
    data["response"]["id"] = "resp_old"
    del data["input"]
    old.write_text(json.dumps(data))
    with running_server(tiny_engine(drafter="ngram"), model_id="t", responses_dir=str(folder)) as (url, _):
        client = openai_client(url)
        assert [i.id for i in client.responses.input_items.list(first.id)] == ids
        assert list(client.responses.input_items.list("resp_old")) == []


def test_page_by_hand():
    items = [{"id": f"i{n}"} for n in range(5)]
    ids = lambda p: [i["id"] for i in p["data"]]  # noqa: E731
    assert ids(response_items.page(items, {})) == ["i4", "i3", "i2", "i1", "i0"]
    between = {"order": "asc", "after": "i1", "before": "i4", "limit": "2"}
    assert ids(response_items.page(items, between)) == ["i2", "i3"]
    p = response_items.page(items, {"before": "i1", "limit": "2"})  # desc: i4 i3 i2 | i1
    assert ids(p) == ["i3", "i2"] and p["has_more"] and p["first_id"] == "i3"
    empty = response_items.page(items, {"after": "i0"})
    assert empty["data"] == [] and empty["first_id"] is None and not empty["has_more"]
    many = [{"id": f"i{n}"} for n in range(150)]
    assert len(response_items.page(many, {})["data"]) == 20  # OpenAI's default page
    most = response_items.page(many, {"limit": "100", "order": "asc"})
    assert ids(most) == [f"i{n}" for n in range(100)] and most["has_more"]  # its largest


def test_input_as_items_by_hand():
    items = response_items.as_items([
        {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "a"},
                                                             {"type": "refusal", "refusal": "no"}]},
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c", "output": "x"}])
    assert items[0]["content"] == [{"type": "output_text", "text": "a", "annotations": []},
                                   {"type": "refusal", "refusal": "no"}]  # an assistant's text is output
    assert items[1]["content"] == [{"type": "input_text", "text": "hi"}]  # (no annotations: not output)
    assert [i.get("status") for i in items] == ["completed", "completed", None, "completed"]  # reasoning has none
    assert items[2]["id"] == "rs_1" and items[3]["id"].startswith("fco_") and items[0]["id"].startswith("msg_")
