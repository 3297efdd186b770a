"""The peer: mlx-lm's own speculative decoding on the same models and prompt.

To time it exactly as the engine is timed (tokens generated / seconds after prompt
processing), the prompt minus its last token is prefilled here, into mlx-lm's own caches,
and timed as the prompt; `stream_generate` then starts from the last prompt token, so its
first round (last prompt token + drafts) counts as generation, as the engine's does.
mlx-lm drafts exactly `num_draft` tokens a round (fewer only near max_tokens); rounds,
drafted and accepted are rebuilt from its per-token `from_draft` flags.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import List, Optional

import mlx.core as mx

PEER_NUM_DRAFT = 3  # mlx-lm's num_draft_tokens for the peer runs
PREFILL_STEP = 512  # prompt chunk size, as mlx-lm's prefill_step_size default


@dataclass
class PeerResult:
    tokens: List[int]
    from_draft: List[bool]
    prompt_tokens: int
    prompt_seconds: float
    seconds: float
    peak_memory_bytes: int
    reported_tps: float  # mlx-lm's own generation_tps of the last response (its timing, for reference)
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accept_histogram: dict = field(default_factory=dict)
    k_histogram: dict = field(default_factory=dict)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0


def rounds_from_flags(from_draft: List[bool], num_draft: int, max_tokens: int):
    """(rounds, drafted, accepted, accept_histogram, k_histogram) rebuilt from mlx-lm's flags.

    Each round yields its accepted drafts (flag True) then one target token (False); a round cut
    by max_tokens ends on a draft. A round that starts with t tokens done drafts min(num_draft,
    max_tokens - t) tokens.
    """
    rounds = drafted = accepted = 0
    acc_h: dict = {}
    k_h: dict = {}
    done = 0  # tokens generated before the current round
    run = 0  # accepted drafts in the current round so far
    n = len(from_draft)
    for i, flag in enumerate(from_draft):
        if flag:
            run += 1
        if not flag or i == n - 1:
            k = min(num_draft, max_tokens - done)
            rounds += 1
            drafted += k
            accepted += run
            k_h[k] = k_h.get(k, 0) + 1
            if k:
                acc_h[run] = acc_h.get(run, 0) + 1
            done = i + 1
            run = 0
    return rounds, drafted, accepted, acc_h, k_h


def run_peer(model, draft_model, tokenizer, prompt_ids: List[int], *, max_tokens: int, temperature: float,
             seed: int, num_draft: int = PEER_NUM_DRAFT, kv_quant=None) -> PeerResult:
    """One mlx-lm speculative generation from a cold cache; greedy at temperature 0.

    Args:
        model, draft_model, tokenizer: the engine's target, draft and tokenizer.
        prompt_ids: the prompt tokens (chat template already applied).
        max_tokens, temperature, seed: as for the engine runs (mx.random is seeded with `seed`).
        num_draft: mlx-lm's `num_draft_tokens`. Default 3.
        kv_quant: the engine's KV quantization (`mlxspec.kvquant.KVQuant`), passed on as mlx-lm's
            kv_bits, kv_group_size and quantized_kv_start (it quantizes the draft's cache too).
            The prompt is fed as the engine feeds it: its caches turn quantized before position
            `start` is fed (mlx-lm's own prefill would read full-precision keys up to the end of
            its first chunk). Past the prompt mlx-lm switches after the pass that reaches `start`.
            Default None: full precision.
    """
    from mlx_lm import stream_generate
    from mlx_lm.models.cache import KVCache, make_prompt_cache
    from mlx_lm.sample_utils import make_sampler

    kv_args = {} if kv_quant is None else dict(kv_bits=kv_quant.bits, kv_group_size=kv_quant.group_size,
                                                quantized_kv_start=kv_quant.start)
    mx.random.seed(seed)
    cache = make_prompt_cache(model) + make_prompt_cache(draft_model)
    n_target = len(model.layers)
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    head = prompt_ids[:-1]
    i = 0
    while i < len(head):  # chunked like mlx-lm's own prefill
        room = kv_quant.room(i) if kv_quant is not None else None
        if room is None and kv_quant is not None:
            cache = [c.to_quantized(group_size=kv_quant.group_size, bits=kv_quant.bits)
                     if type(c) is KVCache else c for c in cache]
        n = min(PREFILL_STEP, room or PREFILL_STEP)
        chunk = mx.array(head[i:i + n], dtype=mx.uint32)[None]
        model(chunk, cache=cache[:n_target])
        draft_model(chunk, cache=cache[n_target:])
        mx.eval([c.state for c in cache])
        i += n
    prompt_seconds = time.perf_counter() - t0

    tokens: List[int] = []
    flags: List[bool] = []
    tps = 0.0
    t1 = time.perf_counter()
    for resp in stream_generate(model, tokenizer, prompt_ids[-1:], max_tokens=max_tokens, draft_model=draft_model,
                                num_draft_tokens=num_draft, sampler=make_sampler(temp=temperature),
                                prompt_cache=cache, **kv_args):
        tokens.append(int(resp.token))
        flags.append(bool(resp.from_draft))
        tps = resp.generation_tps
    seconds = time.perf_counter() - t1
    res = PeerResult(tokens, flags, len(prompt_ids), prompt_seconds, seconds, int(mx.get_peak_memory()), tps)
    (res.rounds, res.drafted, res.accepted, res.accept_histogram,
     res.k_histogram) = rounds_from_flags(flags, num_draft, max_tokens)
    return res


def mlx_lm_cannot_trim(target, draft, tokens: int) -> Optional[str]:
    """Why mlx-lm's speculative decoding cannot run these models over `tokens` positions (prompt,
    answer and a draft round), or None: it trims every layer's cache after a rejection, and a
    sliding-window layer's (Gemma 3's, gpt-oss's) only while its window has not wrapped (mlx-lm
    checks that once, at the start, and trims wrongly after; mlxspec's caches roll back)."""
    from mlx_lm.models.cache import make_prompt_cache

    for role, model in (("target", target), ("draft", draft)):
        for cache in make_prompt_cache(model):
            window = getattr(cache, "max_size", None)
            if window is not None and tokens > window:
                return (f"the {role}'s sliding window ({window} tokens) would wrap within a run ({tokens} "
                        "tokens of prompt, answer and drafts), and mlx-lm cannot trim a wrapped window")
            if window is None and not cache.is_trimmable():
                return f"the {role}'s {type(cache).__name__} caches cannot be trimmed, which mlx-lm needs"
    return None


def mlx_lm_cannot_quantize(target, draft, quant) -> Optional[str]:
    """Why mlx-lm's speculative decoding cannot run these models with the engine's quantized KV
    cache (`mlxspec.kvquant.KVQuant`), or None: it quantizes the draft's cache too, and cannot
    quantize a sliding-window layer's."""
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    from ..errors import InvalidArgumentError
    from ..kvquant import kv_quant

    for role, model in (("target", target), ("draft", draft)):
        if any(isinstance(c, RotatingKVCache) for c in make_prompt_cache(model)):
            return f"mlx-lm cannot quantize the {role}'s sliding-window caches (--kv-bits)"
        try:
            kv_quant(quant.bits, quant.group_size, quant.start, model=model)
        except InvalidArgumentError as e:
            return f"mlx-lm would quantize the {role}'s KV cache too, and for it {e}"
    return None
