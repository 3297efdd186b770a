"""Sharding choices and the single-process paths of the distributed helpers (no launcher needed)."""

from __future__ import annotations

import pytest
from mlx.nn.layers.distributed import AllToShardedLinear, ShardedToAllLinear
from tiny import make_gemma3, make_llama, make_tokenizer

from mlxspec.distributed import Coordinator, history_hash
from mlxspec.errors import IncompatibleModelsError
from mlxspec.loading.fingerprint import files_fingerprint, model_fingerprint, tokenizer_fingerprint
from mlxspec.shard import shard_model


class FakeGroup:
    """Enough of `mx.distributed.Group` to build sharded layers (no collective runs)."""

    def __init__(self, size: int, rank: int = 0):
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_divisible_heads_use_mlx_lm_tensor_parallelism():
    model = make_llama(0, heads=4, kv_heads=2)
    assert shard_model(model, FakeGroup(2)) == "tensor"
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, AllToShardedLinear) and attn.n_heads == 2


def test_indivisible_heads_shard_only_the_mlps():
    model = make_llama(0, hidden=72, heads=9, kv_heads=3)  # SmolLM2's head layout
    assert shard_model(model, FakeGroup(2)) == "tensor-mlp"
    layer = model.model.layers[0]
    assert isinstance(layer.mlp.down_proj, ShardedToAllLinear)
    assert layer.mlp.down_proj.weight.shape[-1] == layer.mlp.gate_proj.weight.shape[0] == 72
    assert not isinstance(layer.self_attn.q_proj, AllToShardedLinear)


def test_an_mlp_that_does_not_split_says_so():
    model = make_llama(0, hidden=72, heads=9, kv_heads=3)  # MLP inner size 2 * 72 = 144 (tiny's default)
    inner = model.model.layers[0].mlp.down_proj.weight.shape[-1]
    with pytest.raises(IncompatibleModelsError, match=f"9 attention heads .*inner size {inner} does not split into 5"):
        shard_model(model, FakeGroup(5))


def test_too_few_layers_to_pipeline_shard_the_mlps():
    """qwen2 pipelines where its heads do not divide; with fewer layers than ranks its MLPs still split."""
    from tiny import make_qwen2

    model = make_qwen2(0, layers=2)  # 4 heads, 2 KV heads, MLP inner size 128
    assert shard_model(model, FakeGroup(4)) == "tensor-mlp"
    assert isinstance(model.model.layers[0].mlp.down_proj, ShardedToAllLinear)
    assert shard_model(make_qwen2(0, layers=4), FakeGroup(4)) == "pipeline"
    with pytest.raises(IncompatibleModelsError, match=r"qwen2 cannot be sharded over 3 ranks: its 4 attention heads "
                       r"\(2 KV\) do not divide by 3 ranks, its 2 layers are too few to pipeline over 3 ranks and "
                       r"its MLPs' inner size 128 does not split into 3 equal parts;"):
        shard_model(make_qwen2(0, layers=2), FakeGroup(3))
    with pytest.raises(IncompatibleModelsError, match=r"its 1 layer is too few"):
        shard_model(make_qwen2(0, layers=1), FakeGroup(3))


@pytest.mark.parametrize("bad", ["abc", "0", "-1", "inf", "nan"])
def test_the_watchdog_timeout_must_be_positive_seconds(bad, monkeypatch):
    from mlxspec.distributed import TIMEOUT_ENV, check_timeout
    from mlxspec.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=f"{TIMEOUT_ENV} .* must be a finite number > 0, got '{bad}'"):
        check_timeout(bad)
    monkeypatch.setenv(TIMEOUT_ENV, bad)
    with pytest.raises(InvalidArgumentError):
        Coordinator(None)
    assert check_timeout("2.5") == 2.5


def test_a_model_that_cannot_be_sharded_is_named():
    model = make_gemma3(0)
    if hasattr(model, "shard") or hasattr(model.model, "pipeline"):
        pytest.skip("this mlx-lm shards gemma3_text")
    with pytest.raises(IncompatibleModelsError, match="gemma3"):
        shard_model(model, FakeGroup(2))


def test_one_rank_shards_nothing():
    model = make_llama(0)
    before = model_fingerprint(model)
    assert shard_model(model, FakeGroup(1)) == "none"
    assert model_fingerprint(model) == before


def test_single_process_coordinator_is_the_identity():
    c = Coordinator(None)
    assert not c.active and c.is_main
    assert c.decide([0, 7], check=123) == [0, 7]
    request = {"ids": [1, 2], "seed": 3}
    assert c.share(request) is request
    assert c.watched(len, "a length") is len
    c.agree({"weights": 1})  # nothing to compare with
    assert c.decisions == 0


def test_history_hash_is_rolling_and_never_zero():
    tokens = [5, 9, 9, 2, 0]
    assert history_hash(tokens) == history_hash(tokens[2:], history_hash(tokens[:2]))
    assert history_hash(tokens) != history_hash(tokens[::-1])
    assert history_hash([]) != 0


def test_fingerprints_tell_files_models_and_tokenizers_apart(tmp_path):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    data = bytes(range(256)) * 4096
    a.write_bytes(data)
    b.write_bytes(data[:-1] + b"\x00")
    assert files_fingerprint(a) == files_fingerprint(a)
    assert files_fingerprint(a) != files_fingerprint(b)
    assert model_fingerprint(make_llama(0)) == model_fingerprint(make_llama(0))
    assert model_fingerprint(make_llama(0)) != model_fingerprint(make_llama(1))
    assert tokenizer_fingerprint(make_tokenizer()) == tokenizer_fingerprint(make_tokenizer())
    assert 0 <= files_fingerprint(a) < 2**62
