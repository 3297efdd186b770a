"""`mlxspec bench --synthetic`: random 4-bit models of named shapes, compared loop to loop."""

import mlx.core as mx
import pytest

from mlxspec.bench import loopbench, synthetic
from mlxspec.errors import InvalidArgumentError

TINY = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, rope_theta=10000.0, rms_norm_eps=1e-5,
            tie_word_embeddings=False, max_position_embeddings=512)


@pytest.fixture
def tiny_shapes(monkeypatch):
    monkeypatch.setitem(synthetic.SHAPES, "tiny-t", TINY)
    monkeypatch.setitem(synthetic.SHAPES, "tiny-d", dict(TINY, num_hidden_layers=1, tie_word_embeddings=True))


def test_build_has_the_shape_and_finite_varied_logits(tiny_shapes):
    m = synthetic.build("tiny-t")
    logits = m(mx.array([[1, 2, 3, 4]]))
    assert logits.shape == (1, 4, TINY["vocab_size"])
    assert bool(mx.isfinite(logits).all())
    # activations keep their scale: logits neither vanish nor blow up through the layers
    std = float(logits.astype(mx.float32).std())
    assert 0.05 < std < 50, std
    assert len({int(t) for t in mx.argmax(logits[0], axis=-1).tolist()}) > 1
    # a draft built for this target has the target's vocabulary
    d = synthetic.build("tiny-d", vocab_size=TINY["vocab_size"], seed=1)
    assert d(mx.array([[1]])).shape[-1] == TINY["vocab_size"]


def test_a_mixture_s_experts_are_drawn_like_any_layer(monkeypatch):
    """qwen3-30b-a3b's kind, small: each expert's packed words random and its scale from its own
    fan-in, so activations keep their scale through the routed layers too."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear

    small = dict(synthetic.SHAPES["qwen3-30b-a3b"], hidden_size=128, num_hidden_layers=3, intermediate_size=256,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=32, vocab_size=256, num_experts=8,
                 num_experts_per_tok=2, moe_intermediate_size=64)
    monkeypatch.setitem(synthetic.SHAPES, "tiny-moe", small)
    m = synthetic.build("tiny-moe")
    experts = m.model.layers[0].mlp.switch_mlp.down_proj
    assert isinstance(experts, QuantizedSwitchLinear) and experts.weight.shape[0] == 8
    assert len({int(w) for w in experts.weight[3].flatten()[:64].tolist()}) > 32  # drawn, not left at zero
    assert float(experts.scales[0, 0, 0]) == pytest.approx((21.25 * 64) ** -0.5, rel=1e-2)  # bfloat16
    logits = m(mx.array([[1, 2, 3, 4, 5, 6]]))
    std = float(logits.astype(mx.float32).std())
    assert bool(mx.isfinite(logits).all()) and 0.05 < std < 50, std
    assert len({int(t) for t in mx.argmax(logits[0], axis=-1).tolist()}) > 1


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gpt-oss-120b"])
def test_gpt_oss_s_experts_are_mxfp4_as_released(monkeypatch, name):
    """gpt-oss's kind, small: the experts in MLX's mxfp4 (a power-of-two scale byte per 32 codes,
    no biases) sized from their fan-in, the rest 4-bit affine, the sinks in the model's dtype."""
    from mlx_lm.models import gpt_oss

    gpt_oss.ModelArgs(**synthetic.SHAPES[name])  # the real shape's settings are the model's
    small = dict(synthetic.SHAPES[name], num_hidden_layers=4, num_local_experts=8, hidden_size=128,
                 intermediate_size=128, head_dim=32, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                 sliding_window=4)
    monkeypatch.setitem(synthetic.SHAPES, "tiny-oss", small)
    m = synthetic.build("tiny-oss")
    experts = m.model.layers[0].mlp.experts.down_proj
    assert (experts.mode, experts.group_size, experts.scales.dtype) == ("mxfp4", 32, mx.uint8)
    assert "biases" not in experts
    scale = 2.0 ** (int(experts.scales[0, 0, 0]) - 127)
    assert (8.5625 * 128) ** -0.5 / 2 ** 0.5 <= scale <= (8.5625 * 128) ** -0.5 * 2 ** 0.5  # a power of two near
    attention = m.model.layers[0].self_attn
    assert attention.q_proj.mode == "affine" and attention.sinks.dtype == attention.q_proj.scales.dtype
    logits = m(mx.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]]))  # past the window of 4
    std = float(logits.astype(mx.float32).std())
    assert bool(mx.isfinite(logits).all()) and 0.05 < std < 50, std
    assert len({int(t) for t in mx.argmax(logits[0], axis=-1).tolist()}) > 1


def test_unknown_shape_names_the_known_ones():
    with pytest.raises(InvalidArgumentError, match="qwen2.5-7b"):
        synthetic.check_shape("gpt-5")


def test_run_synthetic_reports_every_setting_and_ratio(tiny_shapes):
    doc = loopbench.run_synthetic("tiny-t", "tiny-d", max_tokens=8, prompt_tokens=6, repeats=1)
    names = set(doc["settings"])
    assert {"engine plain", "mlx-lm generate_step", "engine ngram k=auto", "engine model k=3",
            "mlx-lm speculative k=3", "engine model k=auto"} <= names
    for name, row in doc["settings"].items():
        assert row["tokens_per_second"] > 0, name
    assert set(doc["ratios"]) >= {"engine plain / generate_step", "engine model k=3 / mlx-lm speculative k=3"}
    assert all(v > 0 for v in doc["ratios"].values())
    assert doc["curve_ms"] and all(v > 0 for v in doc["curve_ms"].values())
    # greedy model drafts at a fixed k verify the same drafts as the peer: accepted fractions are real numbers
    assert 0.0 <= doc["settings"]["engine model k=3"]["acceptance_rate"] <= 1.0
    assert doc["settings"]["engine plain"]["acceptance_rate"] is None  # nothing drafted: "-", not 0 %
    # The loop's own time per round is told apart from the passes' only where a pass does not run
    # while it is enqueued: not on MLX's CPU backend.
    from mlxspec.device import backend

    host = doc["settings"]["engine plain"]["host_ms_per_round"]
    assert host is None if backend() == "cpu" else host > 0


def test_cli_rejects_synthetic_with_a_pair(tiny_shapes, capsys):
    from mlxspec.cli import main

    assert main(["bench", "--synthetic", "tiny-t", "--pair", "demo"]) != 0
    assert "--synthetic builds its own" in capsys.readouterr().err
    assert main(["bench", "--synthetic-draft", "tiny-d"]) != 0
    assert "needs --synthetic" in capsys.readouterr().err


def test_cli_refuses_the_options_synthetic_would_ignore_and_writes_nothing(tiny_shapes, capsys, tmp_path):
    from mlxspec.cli import main

    csv = tmp_path / "runs.csv"
    assert main(["bench", "--synthetic", "tiny-t", "--csv", str(csv), "--check", "--temperature", "0.7",
                 "--drafter", "eagle"]) == 1
    err = capsys.readouterr().err
    assert "does not take --temperature, --drafter, --check, --csv: drop them" in err and not csv.exists()
    assert main(["bench", "--synthetic", "tiny-t", "--lookup", "off"]) == 1
    assert "does not take --lookup: drop it" in capsys.readouterr().err


def test_cli_synthetic_off_a_terminal_says_each_step_and_writes_its_json(tiny_shapes, capsys, tmp_path):
    import json

    from mlxspec.cli import main

    out = tmp_path / "syn.json"
    assert main(["bench", "--synthetic", "tiny-t", "--max-tokens", "4", "--repeats", "1", "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "bench: warming up" in err and "bench: repeat 1/1: engine plain" in err  # a log sees progress
    assert json.loads(out.read_text())["settings"]["engine plain"]["tokens_per_second"] > 0


def test_build_runs_float32_on_a_cpu_and_bfloat16_on_a_gpu(tiny_shapes, monkeypatch):
    from mlxspec import device

    for gpu, dtype in ((False, mx.float32), (True, mx.bfloat16)):
        monkeypatch.setattr(device, "is_gpu", lambda: gpu)
        m = synthetic.build("tiny-t")
        assert m.model.norm.weight.dtype == dtype and m.model.layers[0].self_attn.q_proj.scales.dtype == dtype
