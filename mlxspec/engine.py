"""The one generation loop, for vanilla and speculative decoding alike.

A round: the drafter proposes k tokens (k from the cost model, or fixed); the target runs
once over [last committed token] + drafts; verification decides on the device how many
drafts stand and the next token; one host read; the target cache rolls back the rejected
drafts. Vanilla decoding is the same loop with a drafter that proposes nothing.
"""

from __future__ import annotations

import time
from typing import Dict, Iterator, List, Optional

import mlx.core as mx

from .cache import WindowKVCache
from .costmodel import CostModel
from .modelmeta import context_length, logit_width, weights_bytes
from .device import backend
from .drafters import DRAFTERS, Draft, ModelDrafter, NgramDrafter, NoDrafter
from .errors import ContextLengthError, IncompatibleModelsError, InvalidArgumentError, NumericalError
from .prompts import MAX_DRAFT, check_max_tokens, check_num_draft, check_seed, check_stop, encode_prompt
from . import kernels
from .sampling import SamplingParams
from .sequence import Sequence
from .stats import GenerationResult, GenerationStats, TokenEvent
from .text import TextAssembler



class Engine:
    """Target model (+ optional draft model) with rollback caches, ready to generate.

    Args:
        target_model: a loaded mlx-lm model.
        tokenizer: its tokenizer (mlx-lm TokenizerWrapper-like); None if prompts are token ids.
        draft_model: an optional small mlx-lm model sharing the target's tokenizer.
        draft_tokenizer: the draft's tokenizer, checked against the target's when both are given.
        drafter: "model" (default with a draft model), "ngram" (default without), or "none".
        max_kv_size: sliding window for full-attention layers (first 4 tokens kept), like mlx-lm.
        num_draft: fixed draft length, or None/"auto" to let the cost model choose per round.
        draft_min_confidence: with an adaptive k, a model draft stops after a token whose draft
            probability is below this (default 0.2).
        cost_prior: V(j)/V(1) ratios to start the cost model from; default: the curve saved by
            `mlxspec calibrate` for this model on this device, if any.

    The engine is not thread-safe; one thread at a time may use it. MLX keeps per-thread
    streams: a thread that used the engine and ends should call `mx.clear_streams()`.
    """

    def __init__(self, target_model, tokenizer=None, draft_model=None, *, draft_tokenizer=None,
                 drafter=None, max_kv_size=None, num_draft=None, draft_min_confidence: float = 0.2,
                 prefill_step: int = 512, cost_prior: Optional[Dict[int, float]] = None):
        if drafter is None:
            drafter = "model" if draft_model is not None else "ngram"
        if drafter not in DRAFTERS:
            raise InvalidArgumentError(f"drafter must be one of {', '.join(DRAFTERS)}, got {drafter!r}")
        if drafter == "model" and draft_model is None:
            raise InvalidArgumentError("drafter='model' needs a draft_model; use drafter='ngram' to draft without one")
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.draft_tokenizer = draft_tokenizer
        self.max_kv_size = max_kv_size
        self.num_draft = check_num_draft(num_draft)
        self.vocab_size = logit_width(target_model)
        if draft_model is not None:
            self._check_pair(draft_model, tokenizer, draft_tokenizer)
        self.prefill_step = prefill_step
        self.draft_min_confidence = draft_min_confidence
        self.default_drafter = drafter
        self._prior_slope = 0.1 if backend() == "gpu" else 0.5
        self._prior_draft = None
        if cost_prior is None:
            from .calibration import priors_for

            cost_prior, self._prior_draft = priors_for(target_model, draft_model)
        self._cost_prior = cost_prior
        self._new_state()
        self.context = None if any(isinstance(c, WindowKVCache) for c in self.target.caches) and max_kv_size else context_length(target_model)
        self.target_weights_bytes = weights_bytes(target_model)
        self.draft_weights_bytes = weights_bytes(draft_model) if draft_model is not None else 0

    def _check_pair(self, draft_model, tokenizer, draft_tokenizer):
        if tokenizer is not None and draft_tokenizer is not None:
            from .compat import check_tokenizers

            check_tokenizers(tokenizer, draft_tokenizer)
            return
        dv = logit_width(draft_model)
        if dv != self.vocab_size:
            raise IncompatibleModelsError(
                f"the draft's logits have width {dv} but the target's have {self.vocab_size}; without both "
                f"tokenizers to compare, draft and target must have the same vocabulary size")

    def _new_state(self) -> None:
        """Caches, drafters and cost models: what a fork does not share with its original."""
        headroom = MAX_DRAFT + 1
        self.target = Sequence(self.target_model, max_kv_size=self.max_kv_size, headroom=headroom,
                               prefill_step=self.prefill_step)
        self.drafters = {"none": NoDrafter(), "ngram": NgramDrafter()}
        if self.draft_model is not None:
            self.drafters["model"] = ModelDrafter(self.draft_model, target_vocab=self.vocab_size,
                                                  max_kv_size=self.max_kv_size, headroom=headroom)
        self.costs = {name: CostModel(prior_ratios=self._cost_prior, prior_slope=self._prior_slope,
                                      draft_is_free=not d.uses_model,
                                      prior_draft_ratio=self._prior_draft if d.uses_model else None)
                      for name, d in self.drafters.items()}
        self.last_stats: Optional[GenerationStats] = None

    def set_cost_prior(self, ratios: Optional[Dict[int, float]]) -> None:
        """Start every cost model (and future forks) from these V(j)/V(1) ratios."""
        self._cost_prior = dict(ratios) if ratios else None
        for cost in self.costs.values():
            cost.prior_ratios = dict(ratios or {})

    def fork(self) -> "Engine":
        """A second engine over the same weights with its own caches and statistics."""
        twin = Engine.__new__(Engine)
        twin.__dict__.update(self.__dict__)
        twin._new_state()
        return twin

    def reset(self) -> None:
        """Drop every cache (the next request prefills from scratch); learned costs are kept."""
        self.target.reset()
        for d in self.drafters.values():
            d.reset()

    # -- public API ---------------------------------------------------------------------------
    def generate(self, prompt, **kwargs) -> GenerationResult:
        """Generate to completion; same keywords as `stream`. Returns tokens, text, finish_reason, stats."""
        tokens, pieces, from_draft = [], [], []
        reason = "length"
        stats = None
        for ev in self.stream(prompt, **kwargs):
            tokens.append(ev.token)
            pieces.append(ev.text)
            from_draft.append(ev.from_draft)
            stats = ev.stats
            reason = ev.finish_reason or reason
        return GenerationResult(tokens, "".join(pieces), reason, stats or self.last_stats, from_draft)

    def stream(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, min_p: float = 0.0, seed: Optional[int] = None, speculative: bool = True,
               num_draft=None, stop=None, drafter: Optional[str] = None) -> Iterator[TokenEvent]:
        """Yield one TokenEvent per generated token. Arguments are checked before anything runs.

        Args:
            prompt: str (used as is), list of token ids, or chat messages (chat template applied).
            max_tokens: at most this many tokens (default 256).
            temperature, top_p, top_k, min_p: sampling (default greedy); applied to target and draft alike.
            seed: makes sampling reproducible; None uses MLX's global random state.
            speculative: False decodes plainly (drafter "none").
            num_draft: fixed draft length, or None/"auto" for the engine's setting (cost model by default).
            stop: a string or list of strings; the text is cut before the first one found.
            drafter: override the engine's default drafter for this request.
        """
        params = SamplingParams(temperature, top_p, top_k, min_p)
        max_tokens = check_max_tokens(max_tokens)
        k_fixed = check_num_draft(num_draft) if num_draft is not None else self.num_draft
        stop = check_stop(stop)
        seed = check_seed(seed)
        name = "none" if not speculative else (drafter or self.default_drafter)
        if name not in self.drafters:
            allowed = ", ".join(self.drafters)
            raise InvalidArgumentError(f"drafter {name!r} is not available on this engine; allowed: {allowed}")
        ids = encode_prompt(prompt, self.tokenizer, self.vocab_size)
        if self.context is not None and len(ids) >= self.context:
            raise ContextLengthError(
                f"the prompt has {len(ids)} tokens but the model's context is {self.context}; shorten it "
                f"or set max_kv_size to decode with a sliding window")
        return self._run(ids, params, max_tokens, seed, name, k_fixed, stop)

    # -- the loop -------------------------------------------------------------------------------
    def _run(self, ids: List[int], params: SamplingParams, max_tokens: int, seed: Optional[int],
             name: str, k_fixed: Optional[int], stop: List[str]) -> Iterator[TokenEvent]:
        drafter, cost = self.drafters[name], self.costs[name]
        stats = GenerationStats(prompt_tokens=len(ids), drafter=name, temperature=params.temperature,
                                kernels=kernels.backend_name(),
                                target_weights_bytes=self.target_weights_bytes,
                                draft_weights_bytes=self.draft_weights_bytes if name == "model" else 0)
        self.last_stats = stats
        eos = set(getattr(self.tokenizer, "eos_token_ids", None) or []) if self.tokenizer is not None else set()
        text = TextAssembler(self.tokenizer, stop)
        key = mx.random.key(seed) if seed is not None else None
        mx.reset_peak_memory()

        t0 = time.perf_counter()
        todo = self.target.sync(ids)
        self.target.prefill(todo[:-1])
        if isinstance(drafter, ModelDrafter):
            drafter.prefill(ids)
        stats.prefilled_tokens = len(todo)
        stats.prompt_seconds = time.perf_counter() - t0

        cost.new_request()
        history = list(ids)
        generated = 0
        t_resume = time.perf_counter()
        try:
            while True:
                room = max_tokens - generated
                if self.context is not None:
                    room = min(room, self.context - len(history))
                k_cap = min(room - 1, MAX_DRAFT)
                if key is not None:
                    key, k_draft, k_verify = mx.random.split(key, 3)
                else:
                    k_draft = k_verify = None

                t_d = time.perf_counter()
                shadow = None
                if name == "none" or k_cap <= 0:
                    draft = Draft([])
                elif k_fixed is not None:
                    draft = drafter.propose(history, min(k_fixed, k_cap), params, k_draft)
                elif drafter.uses_model:
                    # A model drafter costs time per token: choose k first; it also stops where it is unsure.
                    k = cost.choose(k_cap)
                    draft = drafter.propose(history, k, params, k_draft,
                                            min_confidence=self.draft_min_confidence) if k else Draft([])
                else:
                    # A free drafter proposes first; k is then chosen for that proposal's kind. When
                    # drafting does not pay, its first token still probes acceptance (shadow).
                    proposal = drafter.propose(history, k_cap, params, k_draft)
                    k = cost.choose(len(proposal.tokens), kind=proposal.kind) if proposal.tokens else 0
                    draft = Draft(proposal.tokens[:k], None, proposal.kind)
                    if proposal.tokens and not k:
                        shadow = proposal.tokens[0]
                t_draft = time.perf_counter() - t_d
                kd = len(draft.tokens)

                t_v = time.perf_counter()
                feed = self.target.sync(history)
                logits = self.target.forward(feed + draft.tokens)[-(kd + 1):]
                out = self._verify(logits, draft, params, k_verify, shadow)
                vals = out.tolist()
                t_verify = time.perf_counter() - t_v
                if not vals[2]:
                    self.reset()
                    raise NumericalError(
                        "the target produced NaN or infinite logits; generation stopped (the engine's caches "
                        "were cleared and it can serve the next request)")
                n, nxt = int(vals[0]), int(vals[1])
                self.target.rollback(kd - n)

                cost.observe_verify(kd + 1, t_verify)
                if kd:
                    cost.observe_draft(kd, t_draft)
                    cost.observe_acceptance(kd, n, draft.kind)
                elif shadow is not None:
                    cost.observe_acceptance(1, vals[3], draft.kind)
                stats.record_round(kd, n)
                stats.draft_seconds += t_draft
                stats.verify_seconds += t_verify

                new = draft.tokens[:n] + [nxt]
                for i, tok in enumerate(new):
                    history.append(tok)
                    generated += 1
                    stats.tokens = generated
                    # Only time spent inside the loop counts: a consumer that pauses between
                    # tokens (a UI racing two engines, a slow printer) does not dilute tokens/s.
                    now = time.perf_counter()
                    stats.seconds += now - t_resume
                    finish = None
                    if tok in eos:
                        piece, finish = text.add(None)[0] + text.flush(), "stop"
                    else:
                        piece, stopped = text.add(tok)
                        if stopped:
                            finish = "stop"
                        elif generated >= max_tokens or (self.context is not None and len(history) >= self.context):
                            piece, finish = piece + text.flush(), "length"
                    if finish:
                        self._finish(stats, name)
                    yield TokenEvent(tok, piece, i < n, stats.rounds - 1, kd, stats, finish)
                    t_resume = time.perf_counter()
                    if finish:
                        return
        finally:
            self._finish(stats, name)

    def _verify(self, logits: mx.array, draft: Draft, params: SamplingParams, key, shadow) -> mx.array:
        """[n_accepted, next_token, all_finite, shadow acceptance] on the device (one read)."""
        kd = len(draft.tokens)
        logits = logits.astype(mx.float32)
        finite = mx.all(mx.isfinite(logits)).astype(mx.float32)
        drafts = mx.array(draft.tokens, dtype=mx.int32)
        if params.greedy:
            target_tokens = mx.argmax(logits, axis=-1).astype(mx.int32)
            res = kernels.verify_greedy(target_tokens, drafts)
            shadow_p = (target_tokens[0] == shadow).astype(mx.float32) if shadow is not None else mx.array(0.0)
        else:
            p = kernels.probabilities(logits, params)
            if draft.probs is not None:
                q = draft.probs
            else:  # deterministic drafter: its distribution is one-hot at each proposal
                q = (mx.arange(p.shape[-1])[None, :] == drafts[:, None]).astype(mx.float32)
            u = mx.random.uniform(shape=(kd + 1,), key=key)
            res = kernels.verify_with_uniforms(p, q, drafts, u)
            shadow_p = p[0, shadow] if shadow is not None else mx.array(0.0)
        return mx.concatenate([res.astype(mx.float32), finite[None], shadow_p[None].astype(mx.float32)])

    def _finish(self, stats: GenerationStats, name: str) -> None:
        stats.peak_memory_bytes = int(mx.get_peak_memory())
        stats.target_kv_bytes = self.target.kv_bytes
        if name == "model":
            stats.draft_kv_bytes = self.drafters["model"].seq.kv_bytes
