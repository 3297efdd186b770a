"""llama.cpp's POST /infill (llama.vscode, llama.vim): the prompt laid out as llama.cpp lays it out
(repository markers, other files, the text typed so far), the completions path's answer, ending
at the model's end-of-middle tokens, in llama.cpp's /completion shape; response_fields; errors."""

from types import SimpleNamespace

import httpx
import pytest

import tiny
from mlxspec.engine import Engine
from mlxspec.fim import SNIPPET, fim_format
from mlxspec.serve.infill import layout
from serve_helpers import TIMEOUT, running_server, sse_events
from test_fim import PREFIX, SUFFIX, ids_of

MARKERS = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>"]
FILES = [{"filename": "geometry/consts.py", "text": "PI = 3.14159\n"}, {"filename": "README", "text": "Areas.\n"}]
BODY = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": "3.", "input_extra": FILES}


def coder(markers=MARKERS):
    tok = tiny.make_tokenizer(added=markers)
    return tok, tiny.ScriptedModel(vocab=tiny.VOCAB + len(markers))


def text_ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


def test_the_layout_is_llama_cpp_s_with_the_repository_markers():
    tok, _ = coder()
    fmt = fim_format(tok)
    repo, sep = ids_of(tok, ["<|repo_name|>", "<|file_sep|>"])
    ids, cut = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=None), BODY, 16)
    want = ([repo] + text_ids(tok, "myproject\n") + [sep] + text_ids(tok, "geometry/consts.py\n")
            + text_ids(tok, "PI = 3.14159\n") + [sep] + text_ids(tok, "README\n") + text_ids(tok, "Areas.\n")
            + [sep] + text_ids(tok, "filename\n") + fmt.encode(tok, PREFIX + "3.", SUFFIX))
    assert ids == want and not cut


def test_without_a_file_marker_other_files_follow_snippet_lines():
    tok, _ = coder(MARKERS[:4])
    fmt = fim_format(tok)
    assert (fmt.repo, fmt.file_sep) == (None, None)
    ids, _ = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=None), BODY, 16)
    assert ids == (text_ids(tok, SNIPPET + "PI = 3.14159\n") + text_ids(tok, SNIPPET + "Areas.\n")
                   + fmt.encode(tok, PREFIX + "3.", SUFFIX))


def test_other_files_are_cut_from_their_start_to_leave_the_answer_room():
    tok, _ = coder()
    fmt = fim_format(tok)
    whole, _ = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=None), BODY, 16)
    fim = fmt.encode(tok, PREFIX + "3.", SUFFIX)
    context = len(whole) + 16 - 10  # ten tokens short
    ids, cut = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=context), BODY, 16)
    assert cut and ids == whole[10:] and len(ids) + 16 == context and ids[-len(fim):] == fim


def test_n_predict_0_still_leaves_the_one_position_a_prompt_must_leave():
    tok, _ = coder()
    fmt = fim_format(tok)
    whole, _ = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=None), BODY, 0)
    model = tiny.ScriptedModel(vocab=tiny.VOCAB + len(MARKERS), length=len(whole))  # all of it: no room left
    with running_server(Engine(model, tok), model_id="coder") as (url, _):
        r = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=0), timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    r = r.json()
    assert r["truncated"] and r["tokens_evaluated"] == len(whole) - 1 and r["content"] == ""


def test_the_middle_is_the_model_s_in_llama_cpp_s_shape():
    tok, model = coder()
    fmt = fim_format(tok)
    ids, _ = layout(SimpleNamespace(fim_format=fmt, tokenizer=tok, context=None), BODY, 40)
    middle = text_ids(tok, "14159 * r * r") + ids_of(tok, ["<|fim_pad|>"])
    n = len(middle)  # (the end-of-middle token counts, as it does in usage)
    model.say(middle, len(ids))
    with running_server(Engine(model, tok, drafter="ngram"), model_id="coder") as (url, _):
        r = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=40), timeout=TIMEOUT).json()
        assert (r["content"], r["stop"], r["stop_type"], r["tokens_predicted"]) == ("14159 * r * r", True, "eos", n)
        assert r["tokens_evaluated"] == len(ids) and r["timings"]["predicted_n"] == n and not r["truncated"]
        assert r["timings"]["prompt_n"] + r["tokens_cached"] == len(ids)
        with httpx.stream("POST", f"{url}/infill", json=dict(BODY, n_predict=40, stream=True), timeout=TIMEOUT) as s:
            events = sse_events(s)
        assert "".join(e["content"] for e in events) == "14159 * r * r"
        assert [e["stop"] for e in events] == [False] * (len(events) - 1) + [True] and events[-1]["tokens_cached"] > 0
        # the fields asked for alone, nested ones flattened by their path (as llama.vscode and llama.vim ask)
        picked = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=40, response_fields=[
            "content", "timings/predicted_n", "truncated", "nothing/here"]), timeout=TIMEOUT).json()
        assert picked == {"content": "14159 * r * r", "timings/predicted_n": n, "truncated": False}
        # n_predict 0 reads the prompt only (the extensions ready the caches so), and a stop word
        warm = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=0), timeout=TIMEOUT).json()
        assert (warm["content"], warm["tokens_predicted"]) == ("", 0)
        r = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=40, stop=[" r"]), timeout=TIMEOUT).json()
        assert (r["content"], r["stop_type"], r["stopping_word"]) == ("14159 *", "word", " r")
        r = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=3), timeout=TIMEOUT).json()
        assert (r["tokens_predicted"], r["stop_type"]) == (3, "limit")


def test_n_indent_and_t_max_predict_ms_end_the_middle_at_a_line_as_llama_cpp_does():
    """llama.vscode sends the cursor's indentation (n_indent) and a time limit (t_max_predict_ms):
    the completion stays in the cursor's block, and ends at a line end once the time is up."""
    tok, model = coder()
    ids, _ = layout(SimpleNamespace(fim_format=fim_format(tok), tokenizer=tok, context=None), BODY, 40)
    lines = "x = 1\n    y = 2\n\n    z = 3\nprint(x)\n"
    with running_server(Engine(model, tok, drafter="ngram"), model_id="coder") as (url, _):
        def answer(**fields):
            model.say(text_ids(tok, lines) + ids_of(tok, ["<|fim_pad|>"]), len(ids))
            return httpx.post(f"{url}/infill", json=dict(BODY, n_predict=40, **fields), timeout=TIMEOUT).json()

        r = answer(n_indent=4)
        assert (r["content"], r["stop_type"]) == ("x = 1\n    y = 2\n\n    z = 3\n", "limit")
        assert answer(n_indent=0)["content"] == answer(n_indent=-1)["content"] == lines
        r = answer(t_max_predict_ms=1e-6)  # the time is up from the first token: its first line
        assert (r["content"], r["stop_type"]) == ("x = 1\n", "limit")
        r = answer(t_max_predict_ms=60_000, n_indent=2)  # the indentation ends it long before
        assert (r["content"], r["stop_type"]) == ("x = 1\n    y = 2\n\n    z = 3\n", "limit")
        assert answer(t_max_predict_ms=-1)["stop_type"] == "eos"


def test_speculation_answers_what_plain_decoding_of_the_layout_does():
    tok = tiny.make_tokenizer(added=MARKERS)
    vocab = tiny.VOCAB + len(MARKERS)
    engine = Engine(tiny.make_llama(0, vocab_size=vocab, tie_embeddings=False), tok, drafter="ngram")
    reference = Engine(tiny.make_llama(0, vocab_size=vocab, tie_embeddings=False), tok)
    ids, _ = layout(reference, BODY, 24)
    want = reference.generate(ids, max_tokens=24, speculative=False, stop_token_ids=list(reference.fim_format.ends))
    with running_server(engine, model_id="coder") as (url, _):
        r = httpx.post(f"{url}/infill", json=dict(BODY, n_predict=24), timeout=TIMEOUT).json()
    assert r["content"] == want.text and r["tokens_predicted"] == want.stats.tokens


@pytest.mark.parametrize("body, param, says", [
    (dict(BODY, n_predict=-2), "n_predict", "n_predict must be an integer >= -1"),
    (dict(BODY, n_predict=1.5), "n_predict", "n_predict must be an integer >= -1"),
    (dict(BODY, input_prefix=5), "input_prefix", "input_prefix must be a string"),
    (dict(BODY, input_extra={"text": "x"}), "input_extra", "input_extra must be a list"),
    (dict(BODY, input_extra=[{"text": 3}]), "input_extra[0]", "input_extra[0] must be"),
    (dict(BODY, response_fields="content"), "response_fields", "response_fields must be a list"),
    (dict(BODY, max_tokens=5), "max_tokens", "send n_predict instead"),
    (dict(BODY, repeat_penalty=-1.0), "repeat_penalty", "repeat_penalty must be"),
    (dict(BODY, temperature="warm"), "temperature", "temperature must be"),
    (dict(BODY, n_indent=1.5), "n_indent", "n_indent must be an integer"),
    (dict(BODY, t_max_predict_ms="soon"), "t_max_predict_ms", "t_max_predict_ms must be a number of milliseconds"),
])
def test_bad_requests_are_refused_naming_the_field(body, param, says):
    tok, model = coder()
    with running_server(Engine(model, tok), model_id="coder") as (url, _):
        r = httpx.post(f"{url}/infill", json=body, timeout=TIMEOUT)
    assert r.status_code == 400 and r.json()["error"]["param"] == param and says in r.json()["error"]["message"]


def test_a_model_without_fill_in_the_middle_markers_says_so():
    with running_server(Engine(tiny.make_llama(0), tiny.make_tokenizer()), model_id="chat") as (url, _):
        r = httpx.post(f"{url}/infill", json=BODY, timeout=TIMEOUT)
    assert r.status_code == 400 and "no fill-in-the-middle markers" in r.json()["error"]["message"]
