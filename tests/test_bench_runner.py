"""The interleaved runner end to end on tiny models (with a draft model, so the mlx-lm peer runs)."""

import pytest
from bench_helpers import PROMPTS, tiny_engine

from tiny import VOCAB, RoundingModel, make_tokenizer

from mlxspec import reference
from mlxspec.bench import runner as runner_mod
from mlxspec.bench.peer import rounds_from_flags
from mlxspec.bench.runner import Setting, run_bench, settings_for
from mlxspec.bench.summary import setting_of, summarize
from mlxspec.engine import Engine
from mlxspec.errors import InvalidArgumentError
from mlxspec.prompts import encode_prompt

MAX = 6


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture(scope="module")
def result(engine):
    return run_bench(engine, PROMPTS, max_tokens=MAX, num_drafts=["auto", 2], drafters=["model", "ngram"])


def test_runs_are_interleaved_prompt_by_prompt(result):
    expected = [("vanilla", None, "0"), ("speculative", "model", "auto"), ("speculative", "model", "2"),
                ("speculative", "ngram", "auto"), ("speculative", "ngram", "2"), ("mlx-lm", "model", "3")]
    order = [(r.prompt_id, r.mode, r.drafter, r.num_draft) for r in sorted(result.runs, key=lambda r: r.order)]
    # Every setting once per prompt, the order rotating by one setting from prompt to prompt, so
    # drift within a prompt's block does not always fall on the same setting.
    n = len(expected)
    assert order == [(p.id, *e) for i, p in enumerate(PROMPTS) for e in expected[i % n:] + expected[:i % n]]
    assert [r.order for r in result.runs] == list(range(len(result.runs)))


def test_every_run_is_complete_and_greedy_outputs_match(result):
    for r in result.runs:
        assert r.tokens == MAX or r.output_tokens[-1] in (2,), r  # 2 = <|im_end|> (EOS) in the tiny tokenizer
        assert r.seconds > 0 and r.tokens_per_second == pytest.approx(r.tokens / r.seconds)
        assert r.matches_vanilla is True and r.mismatch is None
        assert r.prompt_tokens > 0 and r.peak_memory_bytes > 0
    vanilla = [r for r in result.runs if r.mode == "vanilla"]
    assert all(r.drafted == 0 and r.rounds == r.tokens for r in vanilla)
    peer = [r for r in result.runs if r.mode == "mlx-lm"]
    assert all(r.drafted > 0 and r.mlx_lm_generation_tps for r in peer)


def test_each_run_starts_cold_and_each_setting_learns_in_its_own_cost_models(monkeypatch):
    eng = tiny_engine()
    resets = []
    real = eng.reset
    monkeypatch.setattr(eng, "reset", lambda: (resets.append(1), real()))
    start = eng.costs
    used = {}  # setting -> the cost models its runs learnt into
    res = run_bench(eng, PROMPTS[:2], max_tokens=MAX, warmup=False, drafters=["model"], lookups=["on", "off"],
                    on_run=lambda rec: used.setdefault(setting_of(rec), []).append(eng.costs))
    assert len(resets) == len(res.runs)
    for runs in used.values():  # one setting keeps learning across prompts in the same cost models
        assert len(runs) == 2 and runs[0] is runs[1]
    on, off = (used[Setting("speculative", "model", "auto", "auto", v)][0] for v in ("on", "off"))
    assert on is not off and on["model"] is not off["model"]  # settings of one drafter do not teach each other
    # The lookup companion learnt in the lookup=on setting's models only, not in the engine's own.
    assert on["ngram"].counts and not off["ngram"].counts and not start["ngram"].counts
    assert all(c.curve is eng.curve for costs in (on, off, start) for c in costs.values())  # one device curve
    assert eng.costs is start  # the engine gets its own back
    assert eng.curve.measured() or eng.curve.plain.value()  # and the shared curve observed target passes


def test_sampled_runs_are_compared_but_mlx_lms(engine):
    """With the bench's seed a speculative sample is vanilla's, token for token; mlx-lm samples
    otherwise and is not compared."""
    res = run_bench(engine, PROMPTS[:2], max_tokens=8, temperatures=[0.0, 0.7], warmup=False)
    assert [r.temperature for r in res.runs] == ([0.0] * 3 + [0.7] * 3) * 2
    sampled = {r.mode: r for r in res.runs if r.temperature == 0.7 and r.prompt_id == PROMPTS[0].id}
    assert sampled["speculative"].matches_vanilla is True and sampled["speculative"].divergence is None
    assert sampled["speculative"].output_tokens == sampled["vanilla"].output_tokens
    assert sampled["mlx-lm"].matches_vanilla is None
    assert sum(r.drafted for r in res.runs if r.temperature == 0.7 and r.mode == "speculative") > 0


def test_a_wrong_sampled_output_is_a_bug(engine, monkeypatch):
    """A verifier that keeps every draft: at a temperature its output is not vanilla's sample, and
    the race's scores say so."""
    from mlxspec import loop
    from tiny import accept_every_draft

    monkeypatch.setattr(loop, "read", accept_every_draft)
    loud = []
    res = run_bench(engine, PROMPTS, max_tokens=12, temperatures=[1.0], drafters=["model"], num_drafts=[4],
                    peer=False, warmup=False, on_mismatch=loud.append)
    bugs = [r for r in res.runs if r.divergence == "bug"]
    assert bugs and loud == bugs and all(r.matches_vanilla is False and r.mode == "speculative" for r in bugs)
    assert summarize(res)["bugs"] == len(bugs)


def test_a_wrong_output_is_counted_and_reported(engine, monkeypatch):
    real = runner_mod.run_peer

    def wrong_peer(*a, **k):
        r = real(*a, **k)
        r.tokens = [(t + 1) % engine.vocab_size for t in r.tokens]  # a different argmax from token 0
        return r

    monkeypatch.setattr(runner_mod, "run_peer", wrong_peer)
    loud = []
    res = run_bench(engine, PROMPTS[:1], max_tokens=MAX, warmup=False, on_mismatch=loud.append)
    peer = [r for r in res.runs if r.mode == "mlx-lm"]
    assert len(loud) == 1 and loud[0] is peer[0]
    assert peer[0].matches_vanilla is False and peer[0].mismatch["position"] == 0
    assert not peer[0].mismatch["near_tie"] and peer[0].mismatch["logprob_gap"] > 1e-3
    assert peer[0].divergence == peer[0].mismatch["divergence"] == "bug"
    assert peer[0].mismatch["working_dtype"] == "float32" and peer[0].mismatch["float32_gap"] > 1e-3
    s = summarize(res)
    assert s["mismatches"] == s["bugs"] == 1 and s["rounding_divergences"] == 0


def rounding_engine(prompt=PROMPTS[0]):
    """A bfloat16 RoundingModel as target and draft whose tie lies at the third generated token of `prompt`."""
    tok = make_tokenizer()
    ids = encode_prompt(prompt.messages(), tok, VOCAB)
    model = RoundingModel(len(ids) + 1, vocab=VOCAB)
    return Engine(model, tok, model, num_draft=2)


def test_a_rounding_divergence_is_counted_not_reported_as_a_bug():
    loud = []
    res = run_bench(rounding_engine(), PROMPTS[:1], max_tokens=MAX, num_drafts=[2], drafters=["model"],
                    warmup=False, on_mismatch=loud.append)
    spec = [r for r in res.runs if r.mode != "vanilla"]
    assert [r.mode for r in spec] == ["speculative", "mlx-lm"]  # the peer's verify pass rounds alike
    for r in spec:
        assert r.divergence == "rounding" and r.matches_vanilla is True and r.mismatch["position"] == 2
        assert r.mismatch["near_tie"] and r.mismatch["working_dtype"] == "bfloat16"
        assert 0 < r.mismatch["float32_gap"] <= r.mismatch["rounding_bound"]
    assert loud == []
    s = summarize(res)
    assert (s["mismatches"], s["bugs"], s["rounding_divergences"], s["near_ties"]) == (0, 0, 2, 2)
    assert s["rounding_divergence_rate"] == pytest.approx(2 / 6)  # 3 tokens compared per run, up to the flip


def test_an_unclassified_divergence_is_neither_a_match_nor_a_bug(monkeypatch):
    monkeypatch.setattr(reference, "FLOAT32_MEMORY_SHARE", 0.0)  # no float32 copy fits
    loud = []
    res = run_bench(rounding_engine(), PROMPTS[:1], max_tokens=MAX, num_drafts=[2], drafters=["model"],
                    peer=False, warmup=False, on_mismatch=loud.append)
    (spec,) = [r for r in res.runs if r.mode == "speculative"]
    assert spec.divergence == "unclassified" and spec.matches_vanilla is None and loud == [spec]
    assert "no float32 reference" in spec.mismatch["reason"]
    s = summarize(res)
    assert (s["mismatches"], s["bugs"], s["unclassified"]) == (0, 0, 1)


def test_warm_up_is_engine_warmup_for_mlxspec_and_untimed_runs_for_the_peer(monkeypatch):
    eng = tiny_engine()
    calls = []
    real_warmup, real_peer = eng.warmup, runner_mod.run_peer

    def warmup(**kw):
        calls.append(("engine", kw["temperatures"], kw["max_j"]))
        return real_warmup(**kw)

    def peer(*a, **k):
        calls.append(("peer", k["temperature"], k["max_tokens"]))
        return real_peer(*a, **k)

    eng.warmup = warmup
    monkeypatch.setattr(runner_mod, "run_peer", peer)
    monkeypatch.setattr(runner_mod, "default_max_j", lambda: 4)
    res = run_bench(eng, PROMPTS[:1], max_tokens=MAX, num_drafts=["auto", 5], temperatures=[0, 0.5])
    assert calls[0] == ("engine", [0.0, 0.5], 6)  # every verify length: k=5 needs passes of 6
    warm = [("peer", t, n) for t in (0.0, 0.5) for n in (MAX, 1, 2)]  # then k=3's rounds cut short
    assert calls[1:7] == warm and calls[7:] == [("peer", 0.0, MAX), ("peer", 0.5, MAX)]  # the timed runs
    assert sorted(res.curve) == list(range(1, 7)) and all(v > 0 for v in res.curve.values())
    assert set(res.peer_warmup_seconds) == {0.0, 0.5} and res.engine_warmup_seconds > 0
    rows = summarize(res)["settings"]
    for r in rows:
        mine = r["mode"] != "mlx-lm"
        want = res.engine_warmup_seconds if mine else res.peer_warmup_seconds[r["temperature"]]
        assert r["warmup_seconds"] == want


def test_no_peer_where_a_sliding_window_would_wrap_in_a_run():
    """mlx-lm's speculative decoding trims every cache after a rejection, which a sliding-window
    layer's allows only until its window wraps (it raised, or trimmed wrongly): the bench leaves
    the peer out where a run's prompt, answer and drafts outgrow the window, and says why."""
    import tiny
    from mlxspec.bench.prompts import BenchPrompt
    from mlxspec.bench.runner import peer_blocker, run_tokens

    target = tiny.make_llama(0, sliding_window=16, layer_types=["sliding_attention", "full_attention"])
    engine = Engine(target, tiny.make_tokenizer(), tiny.make_llama(1, layers=1))
    prompt = [BenchPrompt("p", "chat", "Say hello.")]
    tokens = run_tokens(engine, prompt, 8)
    assert tokens == len(encode_prompt(prompt[0].messages(), engine.tokenizer, engine.vocab_size)) + 8 + 4 > 16
    assert "sliding window (16 tokens) would wrap" in peer_blocker(engine, tokens)
    assert peer_blocker(engine, 16) is None and [s.mode for s in settings_for(engine, tokens=16)][-1] == "mlx-lm"
    result = run_bench(engine, prompt, max_tokens=8)  # raised in mlx-lm's peer before
    assert [s.mode for s in result.settings] == ["vanilla", "speculative"]
    assert all(r.matches_vanilla for r in result.runs)  # speculation past the window stays lossless


def test_no_peer_without_a_draft_model_and_bad_drafters_rejected():
    eng = tiny_engine(draft=False)
    assert settings_for(eng) == [Setting("vanilla", None, "0"), Setting("speculative", "ngram", "auto")]
    with pytest.raises(InvalidArgumentError, match="no draft model is loaded"):
        settings_for(eng, drafters=["model"])
    with pytest.raises(InvalidArgumentError, match="no EAGLE head is loaded.*--head gives one"):
        settings_for(eng, drafters=["eagle"])
    windowed = Engine(eng.target_model, eng.tokenizer, tiny_engine().draft_model, max_kv_size=64)
    assert [s.mode for s in settings_for(windowed)] == ["vanilla", "speculative"]  # mlx-lm cannot window
    with pytest.raises(InvalidArgumentError, match="num_draft"):
        settings_for(eng, num_drafts=[99])


def test_summary_speedups_are_pairwise_medians(result):
    s = summarize(result)
    van = {r.prompt_id: r.tokens_per_second for r in result.runs if r.mode == "vanilla"}
    spec = {r.prompt_id: r.tokens_per_second for r in result.runs
            if r.mode == "speculative" and r.drafter == "model" and r.num_draft == "auto"}
    ratios = sorted(spec[p] / van[p] for p in van)
    assert s["speedup_vs_vanilla"] == pytest.approx(sum(ratios) / 2)  # median of two
    assert s["default_setting"] == {"drafter": "model", "num_draft": "auto", "temperature": 0.0}
    assert set(s["by_category"]) == {"chat", "code-edit"}
    chat = [r for r in result.runs if r.category == "chat"]
    assert s["by_category"]["chat"]["speedup_vs_vanilla"] == pytest.approx(spec["p-chat"] / van["p-chat"])
    assert s["speedup_vs_mlx_lm"] is not None and chat


def test_summary_pools_the_per_token_acceptance(result):
    rows = {(r["mode"], r["drafter"], r["num_draft"]): r for r in summarize(result)["settings"]}
    fixed = [r for r in result.runs if r.mode == "speculative" and r.drafter == "model" and r.num_draft == "2"]
    assert all(sum(r.step_accepted) == r.accepted for r in fixed)  # chains only: every accepted draft was judged
    pooled = sum(r.accepted for r in fixed) / sum(sum(r.step_reached) for r in fixed)
    assert rows[("speculative", "model", "2")]["judged_acceptance"] == pytest.approx(pooled)
    lo, hi = rows[("speculative", "model", "2")]["judged_acceptance_interval"]
    per_prompt = [r.accepted / sum(r.step_reached) for r in fixed if sum(r.step_reached)]
    # Resampling two prompts: every draw's pooled rate lies between theirs.
    assert min(per_prompt) - 1e-12 <= lo <= pooled <= hi <= max(per_prompt) + 1e-12
    assert rows[("vanilla", None, "0")]["judged_acceptance_interval"] is None
    assert rows[("vanilla", None, "0")]["judged_acceptance"] is None  # nothing drafted
    assert rows[("mlx-lm", "model", "3")]["judged_acceptance"] is None  # the peer reports no positions


@pytest.mark.parametrize("flags, k, max_tokens, expected", [
    ([True, True, True, False], 3, 64, (1, 3, 3)),  # all accepted + bonus
    ([True, False, False, True, False], 3, 64, (3, 9, 2)),
    ([True, True, False, True], 3, 4, (2, 4, 3)),  # second round cut by max_tokens: drafts min(3, 4 - 3) = 1
])
def test_peer_rounds_from_flags(flags, k, max_tokens, expected):
    rounds, drafted, accepted, acc_h, k_h = rounds_from_flags(flags, k, max_tokens)
    assert (rounds, drafted, accepted) == expected
    assert sum(k_h.values()) == rounds


def test_trees_and_chains_side_by_side(engine):
    res = run_bench(engine, PROMPTS[:2], max_tokens=MAX, drafters=["model", "ngram"], trees=["auto", "off"],
                    peer=False, warmup=False)
    spec = [s for s in res.settings if s.mode == "speculative"]
    # Both drafters propose trees (the model's: its chain plus side leaves), so each runs both.
    assert spec == [Setting("speculative", d, "auto", t) for d in ("model", "ngram") for t in ("auto", "off")]
    assert all(r.tree_rounds == 0 for r in res.runs if r.tree == "off")
    assert all(r.matches_vanilla for r in res.runs)
    rows = {r["label"]: r for r in summarize(res)["settings"]}
    assert rows["ngram k=auto"]["speedup_vs_chain"] > 0 and rows["ngram k=auto tree=off"]["speedup_vs_chain"] is None
    assert rows["model k=auto"]["speedup_vs_chain"] > 0
    with pytest.raises(InvalidArgumentError):
        settings_for(engine, trees=["wide"])


def test_a_model_drafter_with_and_without_its_lookup_companion(engine):
    res = run_bench(engine, PROMPTS[:2], max_tokens=MAX, drafters=["model", "ngram"], lookups=["on", "off"],
                    peer=False, warmup=False)
    spec = [s for s in res.settings if s.mode == "speculative"]
    # The free n-gram drafter has no companion: it runs once.
    assert spec == [Setting("speculative", "model", "auto", "auto", "on"),
                    Setting("speculative", "model", "auto", "auto", "off"),
                    Setting("speculative", "ngram", "auto", "auto", "on")]
    assert all(r.lookup_rounds == 0 for r in res.runs if r.lookup == "off")
    assert all(r.matches_vanilla for r in res.runs)
    rows = {r["label"]: r for r in summarize(res)["settings"]}
    assert set(rows) == {"vanilla", "model k=auto", "model k=auto lookup=off", "ngram k=auto"}
    assert rows["model k=auto lookup=off"]["lookup"] == "off" and rows["model k=auto lookup=off"]["lookup_rounds"] == 0
    with pytest.raises(InvalidArgumentError, match="lookup must be 'on' or 'off'"):
        settings_for(engine, lookups=["maybe"])


def test_repeats_pass_over_the_suite_again_and_pair_runs_within_a_pass(engine):
    res = run_bench(engine, PROMPTS, max_tokens=MAX, drafters=["ngram"], peer=False, warmup=False, repeats=2)
    order = [(r.repeat, r.prompt_id, r.mode) for r in res.runs]
    modes = [("vanilla", "speculative"), ("speculative", "vanilla")]
    blocks = [(rep, p.id) for rep in (0, 1) for p in PROMPTS]
    assert order == [(rep, pid, m) for i, (rep, pid) in enumerate(blocks) for m in modes[i % 2]]
    assert all(r.matches_vanilla for r in res.runs)
    # Pretend the machine slowed down during pass 1: both of its runs are 3x slower. Paired
    # within their pass, each ratio is unchanged; paired across passes they would be 3x or 1/3x.
    for r in res.runs:
        if r.repeat == 1:
            r.seconds *= 3
            r.tokens_per_second /= 3
    van = {(r.repeat, r.prompt_id): r.tokens_per_second for r in res.runs if r.mode == "vanilla"}
    want = sorted(r.tokens_per_second / van[r.repeat, r.prompt_id] for r in res.runs if r.mode == "speculative")
    s = summarize(res)
    assert len(want) == 2 * len(PROMPTS)
    assert s["speedup_vs_vanilla"] == pytest.approx((want[1] + want[2]) / 2)  # the median of all four pairs
    chat = sorted(r.tokens_per_second / van[r.repeat, r.prompt_id] for r in res.runs
                  if r.mode == "speculative" and r.category == "chat")
    assert s["by_category"]["chat"]["speedup_vs_vanilla"] == pytest.approx(sum(chat) / 2)
    assert s["by_category"]["chat"]["prompts"] == sum(p.category == "chat" for p in PROMPTS)  # not once a pass
    with pytest.raises(InvalidArgumentError, match="repeats"):
        run_bench(engine, PROMPTS, max_tokens=MAX, repeats=0)


def test_repeated_values_and_fixed_lengths_run_each_distinct_setting_once(engine):
    from mlxspec.commands.argtypes import non_negative, num_draft
    from mlxspec.commands.bench import comma_list

    assert comma_list(non_negative)("0,0.0,0.7") == [0.0, 0.7]
    assert comma_list(num_draft)("2,02,auto") == [2, None]
    got = settings_for(engine, drafters=["model", "model", "ngram"], num_drafts=["auto", 2, "2"],
                       trees=["auto", "off", "off"], lookups=["on", "off"], peer=False)
    spec = [s for s in got if s.mode == "speculative"]
    assert len(spec) == len(set(spec))
    # A fixed length drafts chains by the drafter alone: no tree variants of it, and lookup ones only
    # where the drafter's chains copy or not by it (the draft model's do; the n-gram drafter's are copies).
    assert [s for s in spec if s.num_draft == "2"] == [Setting("speculative", "model", "2", "auto", "on"),
                                                       Setting("speculative", "model", "2", "auto", "off"),
                                                       Setting("speculative", "ngram", "2", "auto", "on")]
    assert {(s.tree, s.lookup) for s in spec if s.drafter == "model" and s.num_draft == "auto"} == {
        ("auto", "on"), ("auto", "off"), ("off", "on"), ("off", "off")}


def test_ctrl_c_keeps_the_prompts_run_whole_and_drops_the_one_cut_short():
    """Ctrl-C mid-suite: every prompt run under every setting is kept (and checked), the prompt it
    cut short is dropped whole, and the engine's own cost models are back; before any prompt ran
    whole there is nothing to show, so the interrupt goes on up."""
    eng = tiny_engine()
    start = eng.costs
    seen = []

    def stop_at(n):
        def on_run(rec):
            seen.append(rec)
            if len(seen) == n:
                raise KeyboardInterrupt
        return on_run

    per_prompt = len(settings_for(eng, drafters=["model"]))
    res = run_bench(eng, PROMPTS, max_tokens=MAX, warmup=False, drafters=["model"], on_run=stop_at(per_prompt + 2))
    assert res.planned_runs == len(PROMPTS) * per_prompt == 2 * per_prompt
    assert len(res.runs) == per_prompt and {r.prompt_id for r in res.runs} == {PROMPTS[0].id}
    assert all(r.matches_vanilla is True for r in res.runs)  # checked, as a whole suite's are
    assert eng.costs is start
    summarize(res)  # a report over what ran
    seen.clear()
    with pytest.raises(KeyboardInterrupt):
        run_bench(eng, PROMPTS, max_tokens=MAX, warmup=False, drafters=["model"], on_run=stop_at(per_prompt - 1))
    assert eng.costs is start
    whole = run_bench(eng, PROMPTS[:1], max_tokens=MAX, warmup=False, drafters=["model"])
    assert len(whole.runs) == whole.planned_runs == per_prompt
