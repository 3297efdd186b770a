"""scripts/train_eagle.py's batched answer generation (the --gguf path, PyTorch): a prompt's
answer and features in a left-padded batch whose finished rows leave it are what the prompt
alone gives. Skipped without torch (CI has none)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mlxspec.training import eagle_data
from mlxspec.training import torch_target
from mlxspec.training import train_common

PAD, V = 0, 64
TOL = 1e-4  # float32; padding only changes the summation layout of masked attention


def _model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def _gen(model, prompts, eos, layers=(), temperature=0.0):
    return eagle_data.generate_batch(model, prompts, max_new=12, temperature=temperature,
                                      gen=torch.Generator().manual_seed(0), eos=eos, pad=PAD, layers=layers)


@pytest.mark.parametrize("layers", [(), (0,)])
def test_rows_that_finish_early_leave_and_every_answer_is_its_own(layers):
    model = _model()
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(1, V, n)) for n in (3, 7, 5, 9, 4, 6)]
    # an end token that some answers reach early and others never: rows leave the batch mid-way
    free = [_gen(model, [p], eos=-1)[0][0][len(p):] for p in prompts]
    eos = next(int(t) for a in free for t in a[1:6] if sum(t in b for b in free) < len(free))
    alone = [_gen(model, [p], eos, layers)[0] for p in prompts]
    batch = _gen(model, prompts, eos, layers)
    lens = [len(r[0]) - len(p) for r, p in zip(batch, prompts)]
    assert min(lens) < 12 and max(lens) == 12  # some ended early, some ran to max_new
    for p, (ids, feats, multi), (ids1, feats1, multi1) in zip(prompts, batch, alone):
        assert ids.tolist() == ids1.tolist()
        n = len(ids) - len(p)
        assert n == 12 or ids[-1] == eos and eos not in ids[len(p):-1].tolist()
        assert feats.shape == (len(ids) - 1, 32)
        assert np.abs(feats.astype(np.float32) - feats1.astype(np.float32)).max() < TOL + 1e-3 * np.abs(feats1).max()
        if layers:
            assert multi.shape == (len(ids) - 1, 32)
            assert np.abs(multi.astype(np.float32) - multi1.astype(np.float32)).max() < TOL + 1e-3 * np.abs(multi1).max()


def test_features_are_the_final_hidden_states_of_the_fed_tokens():
    model = _model()
    p = [5, 9, 2, 11]
    ids, feats, _ = _gen(model, [p, [3, 4]], eos=-1, temperature=0.7)[0]
    with torch.no_grad():
        want = model.model(input_ids=torch.tensor(ids[None, :-1].astype(np.int64))).last_hidden_state[0].numpy()
    assert np.abs(feats.astype(np.float32) - want).max() < 1e-3 * np.abs(want).max() + TOL


def test_the_buffered_cache_holds_what_concatenation_would():
    cache = torch_target.kv_cache(capacity=3)  # smaller than what comes: it must grow
    g = torch.Generator().manual_seed(0)
    ks, vs = [], []
    for m in (2, 1, 4, 1, 1):
        k, v = torch.randn(3, 2, m, 4, generator=g), torch.randn(3, 2, m, 4, generator=g)
        ks.append(k)
        vs.append(v)
        keys, values = cache.update(k, v, 0)
        assert torch.equal(keys, torch.cat(ks, dim=2)) and torch.equal(values, torch.cat(vs, dim=2))
    assert cache.get_seq_length() == 9
    keep = torch.tensor([2, 0])
    cache.batch_select_indices(keep)
    keys, values = cache.update(ks[0][keep], vs[0][keep], 0)
    assert torch.equal(keys, torch.cat([*(k[keep] for k in ks), ks[0][keep]], dim=2))
    assert torch.equal(values, torch.cat([*(v[keep] for v in vs), vs[0][keep]], dim=2))


def test_bfloat16_generation_gives_float32s_features_to_bfloat16s_precision():
    """--generate-precision bfloat16: the features of the same fed tokens (the prompts', before
    any answer can part at a near tie) are float32's within bfloat16's rounding through the
    target's layers, and differ from them (autocast engaged)."""
    model = _model()
    rng = np.random.default_rng(1)
    prompts = [list(rng.integers(1, V, n)) for n in (6, 9, 7)]
    out = {}
    for precision in ("float32", "bfloat16"):
        with eagle_data.step_arithmetic(precision):
            out[precision] = _gen(model, prompts, eos=-1)
    for p, a, b in zip(prompts, out["float32"], out["bfloat16"]):
        fa, fb = (r[1][:len(p)].astype(np.float32) for r in (a, b))
        rel = np.sqrt(((fa - fb) ** 2).mean() / (fa ** 2).mean())
        assert 0 < rel < 8 * 2.0 ** -8, rel  # a few bfloat16 roundings (2^-8 each) through 2 layers


def test_a_batch_reports_progress_while_it_runs(monkeypatch):
    monkeypatch.setattr(train_common, "HEARTBEAT", 0.0)
    calls = []
    eagle_data.generate_batch(_model(), [[3, 4, 5], [6, 7]], max_new=12, temperature=0.0,
                               gen=torch.Generator().manual_seed(0), eos=-1, pad=PAD,
                               progress=lambda step, finished: calls.append((step, finished)))
    # a heartbeat of 0 s: every step says how far it got; no answer ends (no end token)
    assert [s for s, _ in calls] == list(range(12)) and all(f == 0 for _, f in calls)
