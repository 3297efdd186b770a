"""`mlxspec serve` as a user runs it: the real command on the demo pair, offline, the openai client, Ctrl-C."""

import signal

import httpx
import pytest

from mlxspec.device import backend
from mlxspec.loading import demo
from mlxspec.loading.registry import pairs
from serve_helpers import TIMEOUT, free_port, openai_client, server_process, stop_process

pytestmark = [pytest.mark.demo,
              pytest.mark.skipif(not demo.is_cached(), reason="demo GGUF not in the cache; run `mlxspec pull demo`")]

DEFAULT = pairs()["demo"].drafter_on(backend())  # the demo's default drafter on this backend
QUESTION = [{"role": "user", "content": "Write a python function that adds two numbers."}]


@pytest.fixture(scope="module")
def demo_server():
    port = free_port()
    proc = server_process(["-m", "mlxspec", "serve", "--port", str(port), "--queue", "4"], port, timeout=180,
                          HF_HUB_OFFLINE="1")
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            stop_process(proc)


def test_demo_pair_answers_the_openai_client_with_figures_and_reuses_the_conversation(demo_server):
    url, _ = demo_server
    client = openai_client(url)
    assert [m.id for m in client.models.list().data] == ["demo"]
    r1 = client.chat.completions.create(model="demo", messages=QUESTION, max_tokens=16)
    assert "def " in r1.choices[0].message.content and r1.model == "demo"
    figures = r1.model_extra["mlxspec"]
    assert figures["drafter"] == DEFAULT and figures["tokens_per_second"] > 0
    assert figures["tokens_per_target_pass"] >= 1 and 0 <= figures["acceptance_rate"] <= 1

    turn2 = QUESTION + [{"role": "assistant", "content": r1.choices[0].message.content},
                        {"role": "user", "content": "Now make it subtract."}]
    chunks = list(client.chat.completions.create(model="demo", messages=turn2, max_tokens=4, stream=True,
                                                 stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    # Turn 2 prefills only what is new: turn 1's prompt and answer come from the cache (all but the
    # answer's last token, which the model generated but never read).
    assert usage.prompt_tokens_details.cached_tokens == r1.usage.prompt_tokens + r1.usage.completion_tokens - 1
    assert chunks[-1].model_extra["mlxspec"]["prefilled_tokens"] < usage.prompt_tokens / 2
    assert chunks[-2].model_extra["mlxspec"]["drafter"] == DEFAULT


def test_demo_pair_answers_the_ollama_client_as_ollama_describes_its_models(demo_server):
    ollama = pytest.importorskip("ollama")
    from mlxspec.loading.gguf import gguf_parts

    url, _ = demo_server
    client = ollama.Client(host=url, timeout=TIMEOUT)
    (listed,) = client.list().models
    stored = sum(p.stat().st_size for p in gguf_parts(demo.gguf_path()))
    assert listed.model == "demo" and listed.size == stored  # the GGUF's bytes, as Ollama lists its own
    assert (listed.details.format, listed.details.parameter_size, listed.details.quantization_level) == (
        "gguf", "135M", "Q4_1")
    (loaded,) = client.ps().models
    assert loaded.size == loaded.size_vram > stored  # (in memory: dequantized to the working precision)
    assert client.show("demo").modelinfo["llama.context_length"] == 8192
    r = client.chat(model="demo", messages=QUESTION, options={"num_predict": 16})
    assert "def " in r.message.content and r.eval_count == 16 and r.done_reason == "length"


def test_demo_embeddings_put_a_paraphrase_nearer_than_another_topic(demo_server):
    import numpy as np

    url, _ = demo_server
    texts = ["How do I sort a list in Python?", "What is the way to order a Python list?",
             "The weather in Paris is rainy today."]
    r = openai_client(url).embeddings.create(model="demo", input=texts)
    v = np.array([d.embedding for d in r.data])
    assert v.shape == (3, 576) and np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.1  # 0.91 against 0.66 when measured


def test_demo_server_exits_0_on_ctrl_c(demo_server):
    url, proc = demo_server
    proc.send_signal(signal.SIGINT)
    log = stop_process(proc)
    assert proc.returncode == 0, log
    assert "Traceback" not in log
    # what serves, before the warm-up, and where its clients reach it
    assert "pair demo: target demo:smollm2-135m (" in log and f"; drafter {DEFAULT}" in log
    assert f"serving 'demo': OpenAI clients' base URL {url}/v1, Anthropic's and Ollama's {url} (" in log
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=TIMEOUT)

