"""A quantized KV cache (kv_bits): what each position reads, rollback across the switch, and
speculative decoding equal to plain decoding with the same settings."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import QuantizedKVCache

import tiny
from mlxspec import Engine
from mlxspec.errors import CacheRollbackError, InvalidArgumentError
from mlxspec.cache import GrowingKVCache
from mlxspec.kvquant import KVQuant, QuantizedGrowingKVCache, quant_share, quantize_cache
from mlxspec.sequence import Sequence
from test_engine_trees import PROMPT, flat_curve
from test_loader_cli import fake_engine, made, tiny_gguf_path  # noqa: F401 (fixtures)

IDS = [5, 9, 14, 3, 7, 7, 21, 30, 8, 11, 5, 9, 14, 3, 2, 40, 41, 7]


@pytest.fixture(scope="module")
def target():
    # head dimension 32: the smallest group mx.quantize packs; an untied head so the text varies
    return tiny.make_llama(1, heads=2, kv_heads=1, tie_embeddings=False)


def stepwise(model, ids, quant):
    """Logits (S, V) of feeding ids one at a time through a Sequence with `quant`."""
    s = Sequence(model, max_kv_size=None, headroom=8, kv_quant=quant)
    return mx.concatenate([s.forward([t]) for t in ids])


def close(a, b):
    tol = tiny.float32_tol()
    return mx.allclose(a, b, rtol=tol, atol=tol).item()


def test_the_cache_stores_moves_and_reads_back_what_mx_quantize_gives():
    keys, values = mx.random.normal((1, 2, 300, 32)), mx.random.normal((1, 2, 300, 32))
    c = QuantizedGrowingKVCache(32, 4)
    c.update_and_fetch(keys[..., :290, :], values[..., :290, :])  # grows past its 256-position step
    c.trim(5)
    c.update_and_fetch(keys[..., 285:, :], values[..., 285:, :])
    want = mx.dequantize(*mx.quantize(keys, group_size=32, bits=4), group_size=32, bits=4)
    k, v, pos = c.stored(300)
    assert c.offset == 300 and mx.array_equal(k, want) and list(pos) == list(range(300))
    assert not c.can_trim(301) and c.can_trim(300)
    c.move([298, 299], [10, 11])
    k, _, _ = c.stored(300)
    assert mx.array_equal(k[..., 10:12, :], want[..., 298:300, :]) and mx.array_equal(k[..., 12, :], want[..., 12, :])
    assert c.nbytes < (keys.nbytes + values.nbytes) / 2  # 4 bits and a scale and bias per 32 values


@pytest.mark.parametrize("start", [0, 6, 11])
def test_chunks_across_the_switch_compute_what_single_steps_do(target, start):
    quant = KVQuant(4, 32, start)
    ref = stepwise(target, IDS, quant)
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=quant)
    got = mx.concatenate([s.forward(IDS[:4]), s.forward(IDS[4:13]), s.forward(IDS[13:])])
    assert close(got, ref)
    assert isinstance(s.caches[0], QuantizedGrowingKVCache)
    # The switch is real: full-precision keys everywhere give other logits from `start` on.
    full = stepwise(target, IDS, None)
    assert close(full[:start], ref[:start])
    assert not close(full[start:], ref[start:])


@pytest.mark.parametrize("chunk", [3, 512])
def test_prefill_splits_at_the_switch(target, chunk):
    quant = KVQuant(4, 32, 7)
    ref = stepwise(target, IDS, quant)
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=quant, prefill_step=chunk)
    rows = []
    s.prefill(IDS[:-1], rows=lambda i, logits: rows.append(logits) or logits)
    got = mx.concatenate(rows + [s.forward(IDS[-1:])])
    assert close(got, ref)


@pytest.mark.parametrize("sliding", [False, True])
def test_rolling_back_below_the_switch_restores_full_precision(target, sliding):
    if sliding:  # its window layers keep their caches at the switch (only growing ones are quantized)
        target = tiny.make_gemma3(5, sliding_window=6, head_dim=32)
    quant = KVQuant(4, 32, 8)
    ref = stepwise(target, IDS, quant)
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=quant)
    s.forward(IDS[:5])
    s.forward([IDS[5], 1, 2, 3, 4, 6])  # a round across the switch at 8 whose drafts are all rejected
    s.rollback(5)
    assert not isinstance(s.caches[0], QuantizedGrowingKVCache)
    got = mx.concatenate([s.forward(IDS[6:9]), s.forward(IDS[9:])])
    assert close(got, ref[6:])
    # Once a pass starts past the switch, nothing rolls back below it any more: said, not corrupted.
    with pytest.raises(CacheRollbackError, match="quantization switch at 8"):
        s.rollback(len(IDS) - 7)
    assert len(s.tokens) == len(IDS) and s.caches[0].offset == len(IDS)


def test_sync_below_the_switch_rebuilds(target):
    quant = KVQuant(4, 32, 8)
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=quant)
    s.forward(IDS[:12])
    s.forward(IDS[12:])
    other = IDS[:5] + [33, 34, 35, 36, 37, 38]
    todo = s.sync(other)
    assert todo == other  # rebuilt: the shared 5 tokens were computed before the switch
    got = s.forward(todo)
    assert close(got, stepwise(target, other, quant))


def test_plain_decoding_reads_what_mlx_lm_quantized_cache_gives(target):
    """From position 0 quantized: the engine's plain decoding is a loop over mlx-lm's own cache."""
    cache = [QuantizedKVCache(group_size=32, bits=4) for _ in target.layers]
    logits = target(mx.array(IDS, dtype=mx.uint32)[None], cache=cache)
    toks = []
    for _ in range(24):
        toks.append(int(mx.argmax(logits[0, -1]).item()))
        logits = target(mx.array([[toks[-1]]], dtype=mx.uint32), cache=cache)
    r = Engine(target, drafter="none", kv_bits=4, kv_group_size=32, quantized_kv_start=0).generate(IDS, max_tokens=24)
    assert r.tokens == toks


@pytest.mark.parametrize("bits,start", [(8, 0), (4, 0), (4, 10), (4, 23), (4, 30), (2, 41)])
def test_greedy_chains_and_trees_equal_plain_decoding(target, bits, start):
    kw = dict(kv_bits=bits, kv_group_size=32, quantized_kv_start=start)
    plain = Engine(target, drafter="none", **kw).generate(PROMPT, max_tokens=60)
    chain = Engine(target, drafter="ngram", num_draft=3, tree="off", **kw).generate(PROMPT, max_tokens=60)
    trees = flat_curve(Engine(target, drafter="ngram", **kw))
    tree = trees.generate(PROMPT, max_tokens=60)
    assert chain.tokens == plain.tokens and chain.stats.drafted > 0
    assert tree.tokens == plain.tokens and tree.stats.tree_rounds > 0
    assert isinstance(trees.target.caches[0], QuantizedGrowingKVCache)
    # A second turn from an earlier point: a prefix before the switch is recomputed, not trusted.
    follow = PROMPT[:5] + tree.tokens[:9]
    again = trees.generate(follow, max_tokens=30)
    assert again.tokens == Engine(target, drafter="none", **kw).generate(follow, max_tokens=30).tokens


def test_a_draft_model_and_an_eagle_head_stay_lossless(target, tmp_path):
    kw = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=26)
    plain = Engine(target, drafter="none", **kw).generate(PROMPT, max_tokens=40)
    model = Engine(target, None, target, drafter="model", num_draft=4, **kw).generate(PROMPT, max_tokens=40)
    assert model.tokens == plain.tokens and model.stats.accepted > 0
    head = tiny.make_eagle_head(target, tmp_path / "head", copy=True)
    eagle = Engine(target, drafter="eagle", eagle_head=head, num_draft=4, **kw).generate(PROMPT, max_tokens=40)
    assert eagle.tokens == plain.tokens and eagle.stats.accepted > 0


def test_parked_conversations_come_back_quantized(target):
    kw = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=12)
    e = Engine(target, drafter="ngram", prompt_cache_size=2, **kw)
    one, two = PROMPT * 3, [40 + i % 9 for i in range(70)]  # 64 tokens or more are parked
    first = e.generate(one, max_tokens=20)
    e.generate(two, max_tokens=20)
    turn = one + first.tokens + [7, 8, 9]
    got = e.generate(turn, max_tokens=20)
    assert got.stats.prefilled_tokens <= 4  # the parked, quantized caches came back
    assert got.tokens == Engine(target, drafter="none", **kw).generate(turn, max_tokens=20).tokens


@pytest.mark.parametrize("kw,match", [
    (dict(kv_bits=7), "kv_bits must be one of 2, 3, 4, 5, 6, 8"),
    (dict(kv_bits=True), "kv_bits must be one of"),
    (dict(kv_bits=4, kv_group_size=48), "kv_group_size must be one of 32, 64, 128, got 48"),
    (dict(kv_bits=4, kv_group_size=64), r"does not divide this model's head dimension \(32\); allowed here: 32"),
    (dict(kv_bits=4, kv_group_size=32, quantized_kv_start=-1), "quantized_kv_start must be an integer >= 0"),
    (dict(kv_bits=4, kv_group_size=32, quantized_kv_start=True), "quantized_kv_start must be an integer >= 0"),
    (dict(kv_bits=4, kv_group_size=32, max_kv_size=64), "cannot be combined with max_kv_size"),
])
def test_bad_settings_say_what_is_allowed(target, kw, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Engine(target, drafter="none", **kw)


@pytest.mark.parametrize("quantized", [False, True])
def test_a_head_dimension_is_read_from_the_key_projection_where_attention_does_not_name_it(quantized):
    model = tiny.make_qwen2(0, hidden=128)  # qwen2's attention has no head_dim: 64 key rows over 2 heads
    if quantized:  # packing shortens the weight's columns, never its rows
        nn.quantize(model, group_size=64, bits=4)
    with pytest.raises(InvalidArgumentError, match=r"head dimension \(32\); allowed here: 32$"):
        Engine(model, drafter="none", kv_bits=4, kv_group_size=64)
    Engine(model, drafter="none", kv_bits=4, kv_group_size=32)


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 64), (2, 128)])
def test_quant_share_is_what_a_quantized_cache_stores_per_16_bit_byte(bits, group):
    keys = mx.zeros((1, 2, 256, 128), dtype=mx.float16)  # one full 256-position step: no spare room
    c = QuantizedGrowingKVCache(group, bits)
    c.update_and_fetch(keys, keys)
    assert c.nbytes / (2 * keys.nbytes) == quant_share(KVQuant(bits, group, 0))
    assert quant_share(None) == 1.0


def test_growing_again_keeps_every_earlier_entry_and_a_copy_round_trips_through_state():
    keys = mx.random.normal((1, 2, 530, 32))
    c = QuantizedGrowingKVCache(32, 4)
    for a, b in ((0, 250), (250, 270), (270, 530)):  # the second and third writes outgrow the buffers
        c.update_and_fetch(keys[..., a:b, :], keys[..., a:b, :])
    want = mx.dequantize(*mx.quantize(keys, group_size=32, bits=4), group_size=32, bits=4)
    assert mx.array_equal(c.stored(530)[0], want).item()
    copy = QuantizedGrowingKVCache(32, 4)
    copy.state, copy.offset = c.state, c.offset
    assert mx.array_equal(copy.stored(530)[1], want).item()
    assert QuantizedGrowingKVCache(32, 4).state == []


def test_a_rollback_may_reach_the_switch_but_not_cross_it():
    full = GrowingKVCache()
    full.update_and_fetch(mx.ones((1, 2, 10, 32)), mx.ones((1, 2, 10, 32)))
    c = quantize_cache(full, KVQuant(4, 32, 10))
    c.update_and_fetch(mx.ones((1, 2, 5, 32)), mx.ones((1, 2, 5, 32)))
    assert c.floor == 10 and c.can_trim(0) and c.can_trim(5)
    assert not c.can_trim(6) and not c.can_trim(-1)


def test_attention_sinks_are_refused():
    with pytest.raises(InvalidArgumentError, match="has sinks"):
        Engine(tiny.make_gpt_oss(0), drafter="none", kv_bits=4, kv_group_size=32)


def test_kv_bits_none_changes_nothing(target):
    e = Engine(target, drafter="none", kv_bits=None, kv_group_size=128, quantized_kv_start=0)  # unused
    e.generate(IDS, max_tokens=4)
    assert e.kv_quant is None and type(e.target.caches[0]).__name__ == "GrowingKVCache"
    for kw, match in ((dict(kv_group_size=48), "kv_group_size must be one of 32, 64, 128, got 48"),
                      (dict(quantized_kv_start=-5), "quantized_kv_start must be an integer >= 0")):
        with pytest.raises(InvalidArgumentError, match=match):  # a typo in them is said, not ignored
            Engine(target, drafter="none", kv_bits=None, **kw)


def test_the_near_tie_reference_reads_the_same_quantized_cache(target):
    from mlxspec.reference import next_token_logits

    quant = KVQuant(4, 32, 6)
    assert close(next_token_logits(target, IDS, kv_quant=quant), stepwise(target, IDS, quant)[-1])
    assert not close(next_token_logits(target, IDS), stepwise(target, IDS, quant)[-1])


def test_the_commands_pass_the_flags_to_load(made, tiny_gguf_path):
    from mlxspec.cli import main

    main(["generate", "--target", str(tiny_gguf_path), "--kv-bits", "4", "--quantized-kv-start", "0", "Capital?"])
    main(["generate", "--target", str(tiny_gguf_path), "--kv-bits", "8", "--kv-group-size", "32", "Capital?"])
    main(["generate", "--target", str(tiny_gguf_path), "Capital?"])
    got = [(e.args["kv_bits"], e.args["kv_group_size"], e.args["quantized_kv_start"]) for e in made]
    assert got == [(4, 64, 0), (8, 32, 5000), (None, 64, 5000)]


@pytest.mark.parametrize("argv,said", [
    (["--kv-bits", "7"], "invalid choice: 7 (choose from 2, 3, 4, 5, 6, 8)"),
    (["--kv-bits", "4", "--kv-group-size", "16"], "invalid choice: 16 (choose from 32, 64, 128)"),
    (["--kv-bits", "4", "--quantized-kv-start", "-1"], "expected an integer >= 0"),
])
def test_bad_flags_are_refused_by_the_parser(argv, said, capsys):
    from mlxspec.cli import main

    with pytest.raises(SystemExit):
        main(["generate", *argv, "hi"])
    assert said in capsys.readouterr().err


def test_load_checks_the_settings_before_loading_anything():
    import mlxspec

    with pytest.raises(InvalidArgumentError, match="kv_bits must be one of"):
        mlxspec.load("no/such-model-anywhere", kv_bits=1, download=False)
    with pytest.raises(InvalidArgumentError, match="cannot be combined with max_kv_size"):
        mlxspec.load("no/such-model-anywhere", kv_bits=4, max_kv_size=100, download=False)


def test_a_divergence_is_judged_by_the_target_fed_in_several_shapes(target):
    from mlxspec.reference import BUG, ROUNDING, judge

    quant = KVQuant(4, 32, 0)
    z = stepwise(target, IDS, quant)[-1]
    order = mx.argsort(z)[::-1].tolist()
    clear = judge(target, IDS, order[0], order[-1], kv_quant=quant)  # the best token against the worst
    assert clear.kind == BUG and clear.float32_gap > 1 and "chunks of 512, 64, 16, 3 tokens" in clear.reason
    swapped = judge(target, IDS, order[1], order[0], kv_quant=quant)  # plain's token ranked below the other
    assert swapped.kind == ROUNDING and swapped.float32_gap < 0


def test_bfloat16_divergences_with_a_quantized_cache_are_judged_rounding():
    """In bfloat16 a verify pass's width alone can move a one-ulp gap to a tie (the lower id then
    wins): probing chunkings only, one of these was called a bug."""
    import random

    from mlxspec.bench.neartie import check_greedy
    from mlxspec.kvquant import kv_quant

    t = tiny.make_llama(11, hidden=128, heads=2, kv_heads=1, tie_embeddings=False, dtype=mx.bfloat16)
    d = tiny.make_llama(12, hidden=64, heads=2, kv_heads=1, layers=1, tie_embeddings=False, dtype=mx.bfloat16)
    tok, kw = tiny.make_tokenizer(), dict(kv_bits=4, quantized_kv_start=0)
    plain, spec = Engine(t, tok, **kw), Engine(t, tok, d, drafter="model", num_draft=4, **kw)
    judged = []
    for s in range(12):
        rng = random.Random(s)
        prompt = [rng.randrange(3, 259) for _ in range(rng.choice([3, 20, 80]))]
        ref = plain.generate(prompt, max_tokens=32, speculative=False).tokens
        got = spec.generate(prompt, max_tokens=32).tokens
        if ref != got:
            judged.append(check_greedy(t, prompt, ref, got, kv_quant=kv_quant(4, 64, 0)).judgement)
    assert judged, "no divergence to judge: the premise (bfloat16 + 4-bit cache parts at near-ties) failed"
    assert all(j.kind == "rounding" for j in judged), [j.reason for j in judged if j.kind != "rounding"]


def test_the_bench_says_what_cache_it_ran(target):
    from mlxspec.bench.report import greedy_line, pair_info

    e = Engine(target, drafter="ngram", kv_bits=4, kv_group_size=32, quantized_kv_start=100)
    pair = pair_info(e, ["ngram"])
    assert pair["kv_cache"] == {"bits": 4, "group_size": 32, "quantized_kv_start": 100}
    assert pair_info(Engine(target, drafter="ngram"), ["ngram"])["kv_cache"] is None
    doc = {"pair": pair, "runs": [], "summary": {"rounding_divergences": 0, "bugs": 0}}
    assert "KV cache is 4-bit from 100 tokens" in greedy_line(doc) and "float32 reference" not in greedy_line(doc)


def test_served_with_a_quantized_cache(target):
    pytest.importorskip("openai")
    import httpx
    from serve_helpers import TIMEOUT, openai_client, running_server

    engine = Engine(target, tiny.make_tokenizer(), drafter="ngram", kv_bits=4, kv_group_size=32, quantized_kv_start=8)
    hello = [{"role": "user", "content": "Say hello, say hello."}]
    with running_server(engine, model_id="q") as (url, _):
        card = httpx.get(f"{url}/v1/models/q", timeout=TIMEOUT).json()
        r = openai_client(url).chat.completions.create(model="q", messages=hello, max_tokens=24, temperature=0)
    assert card["mlxspec"]["kv_bits"] == 4
    plain = Engine(target, tiny.make_tokenizer(), drafter="none", kv_bits=4, kv_group_size=32, quantized_kv_start=8)
    assert r.choices[0].message.content == plain.generate(hello, max_tokens=24).text


@pytest.mark.parametrize("start", [0, 9])
def test_mlx_lm_peer_runs_with_the_same_quantized_cache(target, start):
    from mlxspec.bench.peer import run_peer

    quant = KVQuant(4, 32, start)
    ids = PROMPT[:20]
    r = run_peer(target, target, tiny.make_tokenizer(), ids, max_tokens=16, temperature=0.0, seed=0, kv_quant=quant)
    plain = Engine(target, drafter="none", kv_bits=4, kv_group_size=32, quantized_kv_start=start)
    assert r.tokens == plain.generate(ids, max_tokens=16).tokens
    full = run_peer(target, target, tiny.make_tokenizer(), ids, max_tokens=16, temperature=0.0, seed=0)
    assert full.tokens != r.tokens  # the quantized cache was used


def test_the_bench_leaves_mlx_lm_out_where_it_cannot_quantize(target):
    from mlxspec.bench.runner import peer_blocker

    quant = dict(kv_bits=4, kv_group_size=32, quantized_kv_start=0)
    assert peer_blocker(Engine(target, None, target, **quant), 100) is None
    narrow = tiny.make_llama(2, tie_embeddings=False)  # head dimension 16
    said = peer_blocker(Engine(target, None, narrow, **quant), 100)
    assert "draft's KV cache too" in said and "head dimension (16)" in said
    sliding = tiny.make_gemma3(5, sliding_window=6)
    assert "sliding-window" in peer_blocker(Engine(target, None, sliding, **quant), 100)


def test_a_tree_across_the_switch_is_refused_not_computed(target):
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=KVQuant(4, 32, 8))
    s.forward(IDS[:6])
    with pytest.raises(ValueError, match="quantization switch at 8; the loop keeps trees to 1 levels there"):
        s.forward_tree([IDS[6], 1, 2, 3], [-1, 0, 0])  # depth 2 from position 6 reaches position 8
    assert len(s.tokens) == 6 and not s.dirty
    s.forward_tree([IDS[6], 1, 2], [-1, -1])  # depth 1: positions 6 and 7
    s.keep_path(6, [0])
    assert s.tokens == IDS[:7] + [1]


def test_generate_says_which_cache_it_runs():
    from types import SimpleNamespace

    from mlxspec.commands.generate import load_line

    info = SimpleNamespace(ref="t.gguf", weights_bytes=2**20, dtype="float32", quantization="Q4_1")
    engine = SimpleNamespace(pair_name=None, target_info=info, draft_info=None, head_ref=None, default_drafter="ngram",
                             kv_quant=KVQuant(4, 64, 5000))
    assert load_line(engine).endswith("; drafter ngram; KV cache 4-bit from 5000 tokens")
    engine.kv_quant = None
    assert "KV cache" not in load_line(engine) and "sharded" not in load_line(engine)
    engine.target_info = SimpleNamespace(**vars(info), sharding="tensor-mlp")  # --distributed over 2 ranks
    engine.coord = SimpleNamespace(size=2)
    assert load_line(engine).startswith("target t.gguf (1 MiB float32 on this rank, sharded over 2 ranks "
                                        "(tensor-mlp), stored Q4_1)")


def test_passes_of_several_rows_read_a_dequantized_copy_through_fused_attention():
    keys = mx.random.normal((1, 2, 3, 32))
    c = QuantizedGrowingKVCache(32, 4)
    k, v = c.update_and_fetch(keys[..., :2, :], keys[..., :2, :])  # two rows: the fewest that read dense
    assert not hasattr(c, "bits") and k.dtype == mx.float32 and k.shape == (1, 2, 2, 32)  # mx.fast attention
    assert mx.array_equal(k, c.stored(2)[0])
    k, v = c.update_and_fetch(keys[..., 2:, :], keys[..., 2:, :])
    assert c.bits == 4 and isinstance(k, tuple) and k[0].shape[2] == 3  # mlx-lm's quantized attention


def test_a_generate_call_with_mlx_lm_s_keyword_is_told_where_it_goes(target):
    with pytest.raises(InvalidArgumentError, match=r"'kv_bits' \(mlx-lm's; here: Engine\(\.\.\., kv_bits=\)"):
        Engine(target, drafter="none").generate(IDS, max_tokens=2, kv_bits=4)


def test_lazy_tokens_across_the_switch_hold_one_place_each(target):
    """A round whose drafts are still on the device, fed across the switch in two parts."""
    quant = KVQuant(4, 32, 6)
    ref = stepwise(target, IDS, quant)
    s = Sequence(target, max_kv_size=None, headroom=8, kv_quant=quant)
    first = s.forward(IDS[:4])
    lazy = s.forward(mx.array(IDS[4:13]))
    assert s.tokens == IDS[:4] + [None] * 9 and s.caches[0].offset == 13
    s.settle(4, IDS[4:13])
    got = mx.concatenate([first, lazy, s.forward(IDS[13:])])
    assert s.tokens == IDS and close(got, ref)
    assert isinstance(s.caches[0], QuantizedGrowingKVCache)
