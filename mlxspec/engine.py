"""`Engine`: a target (+ a drafter) with rollback caches, ready to generate.

The engine owns the state (caches, drafters, the cost model); every request's arguments are
checked before any work (`mlxspec.request`); `mlxspec.loop` is the one generation loop that
runs a request, plain or speculative. `warmup()` runs every shape once so no timed run pays first-use
compilation (see `mlxspec.warmup`).

Given an `mx.distributed` group of several ranks, the target is taken as sharded over it
(see `mlxspec.shard`): every rank runs the same requests, rank 0's (`stream` shares each
request from rank 0), and rank 0 makes every decision (`mlxspec.distributed`).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import astuple
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import mlx.core as mx

from . import kernels
from .backbone import split_model
from .cache import WindowKVCache
from .calibration import check_ratios, prior_slope, priors_for
from .costmodel import DECAY, MODEL_DECAY, CostModel
from .device import is_gpu
from .distributed import Coordinator
from .drafters import EagleDrafter, ModelDrafter, NgramDrafter, NoDrafter
from .drafters.eagle import head_window
from .dry import Dry, breaking_tokens
from .embed import Embeddings, check_normalize, check_pooling, encode_inputs, normalized, pooled
from .errors import IncompatibleModelsError, InvalidArgumentError
from .fim import FimFormat, fim_format
from .grammar import AfterThinking, Constraint, token_table
from .kvquant import DEFAULT_KV_GROUP_SIZE, DEFAULT_QUANTIZED_KV_START, kv_quant
from .loop import draw_seed, generate
from .modelmeta import check_model, context_length, logit_width, weights_bytes
from .occupancy import Occupancy
from .penalties import Penalties
from .prompt_cache import PromptCache
from .prompts import (MAX_DRAFT, as_mlx_lm_tokenizer, check_cancel, check_drafter, check_lookup,
                      check_no_other_options, check_num_draft, check_prompt_cache_bytes, check_prompt_cache_size,
                      check_tree, encode_prompt)
from .request import check_request
from .sampling import SamplingParams, banned, bias_row
from .sequence import Sequence
from .stats import GenerationResult, GenerationStats, TokenEvent
from .target_curve import TargetCurve
from .text import token_texts
from .tools import ToolFormat, tool_format


class Engine:
    """Target model (+ optional draft model) with rollback caches, ready to generate.

    Args:
        target_model: a loaded mlx-lm model.
        tokenizer: its tokenizer (mlx-lm's TokenizerWrapper; a Hugging Face tokenizer is wrapped in
            one); None if prompts are token ids.
        draft_model: an optional small mlx-lm model sharing the target's tokenizer.
        draft_tokenizer: the draft's tokenizer, checked against the target's when both are given.
        drafter: "model" (default with a draft model), "eagle" (needs `eagle_head`), "ngram" (default
            without a draft model), or "none".
        eagle_head: an EAGLE head folder trained for this target (see `mlxspec.drafters.eagle`);
            with it the target's passes keep their hidden states and `drafter="eagle"` is available.
        max_kv_size: sliding window for full-attention layers (first 4 tokens kept), like mlx-lm.
        kv_bits: quantize the target's growing KV caches to this many bits (2, 3, 4, 5, 6 or 8), as
            mlx-lm's kv_bits does, once the context reaches `quantized_kv_start` tokens (default
            None: full precision). Not with `max_kv_size`. Greedy output equals plain decoding's
            with the same settings up to near-ties, which a quantized cache makes wider than
            bfloat16 does (`mlxspec.kvquant`); the drafters' own caches stay in full precision.
        kv_group_size: values sharing one scale and bias (32, 64 or 128; default 64).
        quantized_kv_start: the context length from which the cache is quantized (default 5000,
            mlx-lm's command line; 0 quantizes from the first token).
        num_draft: fixed draft length, or None/"auto" to let the cost model choose per round.
        tree: draft trees: None/"auto" (default: the cost model sizes them, a chain where branches
            do not pay), "off" (chains only), or an int N capping what a round drafts, tree or
            chain, at N tokens. With a fixed num_draft every round is a chain and tree is unused.
        lookup: a model drafter ("model", "eagle") may hand a round to prompt lookup (the n-gram
            drafter) where the cost models expect that to be faster, e.g. where the answer
            copies the prompt (default True; False: the model drafts every round it drafts).
            Never with a fixed num_draft or several ranks. With it a model drafter's chains (the
            draft model's or an EAGLE head's) also copy, step by step, where the text repeats and
            the drafter is unsure (`drafters.chaincopy`; also with a fixed num_draft).
        prefill_step: prompt tokens fed per pass (default 512); a cancelled request stops between two.
        prompt_cache_size: earlier histories kept for when their conversation comes back (default
            0: the caches hold the last request's only; `mlxspec.prompt_cache`). A request that
            would discard 64 or more cached tokens parks a copy of them; one that shares more
            with a parked history than with the live caches swaps it in. Each costs the memory of
            its KV cache. Not with several ranks.
        prompt_cache_bytes: at most this many bytes parked together (default None: no bound but
            `prompt_cache_size`); the least recently used leave first.
        cost_prior: V(j)/V(1) ratios to start the cost model from; default: the curve saved by
            `mlxspec calibrate` for this model on this device, if any.
        group: an `mx.distributed.Group` the target is sharded over (see `mlxspec.shard`), or
            None (default, one process). With several ranks every rank must call the same
            methods in the same order (or follow rank 0 with `follow()`); rank 0's requests
            and decisions are used on all of them.

    One thread at a time may run a generation: a request from another thread while one runs
    raises `EngineBusyError` (give each thread its own `fork()`). MLX keeps per-thread
    streams; a thread that ran a generation frees its own as it ends.
    It runs one generation at a time: a new request ends a stream still open (which raises
    `StreamOvertakenError` if resumed); `fork()` gives a second engine over the same weights.
    On a GPU call `warmup()` once before timing anything (the first pass of each shape compiles).
    """

    def __init__(self, target_model, tokenizer=None, draft_model=None, *, draft_tokenizer=None,
                 drafter=None, max_kv_size=None, num_draft=None, tree=None, prefill_step: int = 512,
                 cost_prior: Optional[Dict[int, float]] = None, group=None, eagle_head=None, lookup: bool = True,
                 prompt_cache_size: int = 0, prompt_cache_bytes: Optional[int] = None, kv_bits: Optional[int] = None,
                 kv_group_size: int = DEFAULT_KV_GROUP_SIZE, quantized_kv_start: int = DEFAULT_QUANTIZED_KV_START):
        check_model("target_model", target_model)
        if draft_model is not None:
            check_model("draft_model", draft_model)
        if drafter is None:
            drafter = "model" if draft_model is not None else "ngram"
        check_drafter(drafter)
        if drafter == "model" and draft_model is None:
            raise InvalidArgumentError("drafter='model' needs a draft_model; use drafter='ngram' to draft without one")
        if drafter == "eagle" and eagle_head is None:
            raise InvalidArgumentError("drafter='eagle' needs eagle_head (a head folder trained for this target)")
        # The cheap checks first: nothing is read or built for a request that cannot run.
        self.num_draft = check_num_draft(num_draft)
        self.tree = check_tree(tree)
        self.lookup = check_lookup(lookup)
        if isinstance(prefill_step, bool) or not isinstance(prefill_step, int) or prefill_step < 1:
            raise InvalidArgumentError(f"prefill_step must be an integer >= 1 (prompt tokens per pass), "
                                       f"got {prefill_step!r}")
        self.prefill_step = prefill_step
        self.prompt_cache_size = check_prompt_cache_size(prompt_cache_size)
        self.prompt_cache_bytes = check_prompt_cache_bytes(prompt_cache_bytes)
        self.kv_quant = kv_quant(kv_bits, kv_group_size, quantized_kv_start, model=target_model, max_kv_size=max_kv_size)
        tokenizer, draft_tokenizer = as_mlx_lm_tokenizer(tokenizer), as_mlx_lm_tokenizer(draft_tokenizer)
        self.target_model, self.tokenizer, self.draft_model = target_model, tokenizer, draft_model
        self.coord = Coordinator(group)
        self.eagle = None  # (head, draft ids, config); only then do target passes keep hidden states
        if eagle_head is not None:
            from .drafters.eagle import load_head

            self.eagle = load_head(eagle_head, target_model, self.coord)
        self.draft_tokenizer = draft_tokenizer
        self._backbone = None  # the target's backbone, split off its head for embeddings (`embed`)
        self._grammar_table = None  # llguidance's view of the tokenizer, built by `prepare_grammar`
        self.max_kv_size = max_kv_size
        self.vocab_size = logit_width(target_model)
        if draft_model is not None:
            self._check_pair(draft_model, tokenizer, draft_tokenizer)
        self.default_drafter = drafter
        self._prior_slope = prior_slope(target_model)
        self._prior_draft = None
        cost_prior = check_ratios(cost_prior)
        if cost_prior is None:
            cost_prior, self._prior_draft = priors_for(target_model, draft_model)
        self._cost_prior = cost_prior
        self.warmed_passes: Optional[int] = None  # longest pass `warmup` ran (tokens); kernels are per process
        self._new_state()
        context = context_length(target_model)
        # A window below the context lets decoding go on past it (as mlx-lm's --max-kv-size); one as
        # wide or wider never slides before the context is full, so the context still bounds it.
        slides = bool(max_kv_size) and any(isinstance(c, WindowKVCache) for c in self.target.caches)
        self.context = None if slides and (context is None or max_kv_size < context) else context
        self.target_weights_bytes = weights_bytes(target_model)
        self.draft_weights_bytes = weights_bytes(draft_model) if draft_model is not None else 0
        self.eagle_weights_bytes = weights_bytes(self.eagle[0]) if self.eagle is not None else 0

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
                               prefill_step=self.prefill_step, keep_hidden=self.eagle is not None,
                               hidden_layers=tuple(self.eagle[2].get("feature_layers") or ()) if self.eagle else (),
                               kv_quant=self.kv_quant)
        self.drafters = {"none": NoDrafter(), "ngram": NgramDrafter()}
        if self.draft_model is not None:
            self.drafters["model"] = ModelDrafter(self.draft_model, target_vocab=self.vocab_size,
                                                  max_kv_size=self.max_kv_size, headroom=headroom,
                                                  copier=self.drafters["ngram"])
        if self.eagle is not None:
            head, draft_ids, cfg = self.eagle
            self.drafters["eagle"] = EagleDrafter(head, draft_ids, self.target, max_kv_size=self.max_kv_size,
                                                  headroom=headroom, prefill_step=self.prefill_step,
                                                  copier=self.drafters["ngram"], window=head_window(cfg))
        self.curve = TargetCurve(prior_ratios=self._cost_prior, prior_slope=self._prior_slope,
                                 first_use_compiles=is_gpu())
        self.costs = {name: CostModel(self.curve, draft_is_free=not d.uses_model,
                                      decay=MODEL_DECAY if d.uses_model else DECAY,
                                      prior_draft_ratio=self._prior_draft if name == "model" else None)
                      for name, d in self.drafters.items()}
        self.drafters["ngram"].judge = self.costs["ngram"].alpha_of  # a prediction's drafts against the history's
        self.prompt_cache = PromptCache(0 if self.coord.active else self.prompt_cache_size, self.prompt_cache_bytes)
        self.last_stats: Optional[GenerationStats] = None
        # The open generation's release (`loop.generate`): a later request calls it to end that one.
        self.generation: Optional[Callable[[], None]] = None
        self.occupancy = Occupancy()  # the thread running a generation now (`mlxspec.occupancy`)

    def set_cost_prior(self, ratios: Optional[Dict[int, float]]) -> None:
        """Start the cost model (and future forks) from these V(j)/V(1) ratios."""
        ratios = check_ratios(ratios)
        self._cost_prior = dict(ratios) if ratios else None
        self.curve.prior_ratios = dict(ratios or {})

    def warmup(self, *, temperatures: Iterable[float] = (0.0,), max_j: Optional[int] = None) -> Dict:
        """Run every shape the engine may use once, so no later run pays first-use compilation.

        Target passes of 1..max_j tokens (greedy, and sampled at each of `temperatures`),
        pipelined plain steps and every model drafter's catch-up and draft steps run on a
        short synthetic prefix; their timings seed the cost model. Caches are left empty.
        Call it once after loading, before timing anything (bench and chat do).

        Args:
            temperatures: sampling settings to warm as well. Default (0.0,).
            max_j: longest target pass, tokens. Default 16 on a GPU, 8 on the CPU.

        Returns:
            {"seconds": time spent, "curve": {j: seconds of a pass over j tokens}, "plain": seconds per
            pipelined plain step}.
        """
        from .warmup import warm_up

        return warm_up(self, max_j=max_j, temperatures=temperatures)

    def fork(self) -> "Engine":
        """A second engine over the same weights with its own caches and statistics."""
        twin = Engine.__new__(Engine)
        twin.__dict__.update(self.__dict__)
        twin._new_state()
        return twin

    def reset(self) -> None:
        """Drop every cache (the next request prefills from scratch); learned costs are kept.
        A stream still open ends first, as if closed (`StreamOvertakenError` if it resumes)."""
        self.occupancy.enter(then=self.end_open_stream)
        try:
            self.target.reset()
            self.prompt_cache.clear()
            for d in self.drafters.values():
                d.reset()
        finally:
            self.occupancy.leave()

    def forget_beyond(self, prompt, *, chat_template_kwargs=None) -> bool:
        """Prompt lookup (the n-gram drafter's, also a model drafter's and the head's companion)
        forgets what the history it holds has past its shared prefix with `prompt` (the next
        request's: a string, token ids or chat messages), as if it had never been generated:
        after turns are taken back from a conversation (a chat's /retry or /undo), the next
        answer's drafts cannot copy the answers it replaces. The caches are left as they are
        (the next request rolls them back to what it shares). Returns whether it forgot any."""
        ids = encode_prompt(prompt, self.tokenizer, self.vocab_size, template_kwargs=chat_template_kwargs)
        self.occupancy.enter(then=self.end_open_stream)
        try:
            return self.drafters["ngram"].forget_beyond(ids)
        finally:
            self.occupancy.leave()

    def end_open_stream(self) -> None:
        """A stream still open ends here, as if closed (`StreamOvertakenError` if it resumes)."""
        if self.generation is not None:
            self.generation()

    def materialize(self) -> None:
        """Evaluate every array the engine keeps between requests (caches, kept features, a model
        drafter's last drafts). A lazy array belongs to the streams of the thread that built it;
        a thread that ends frees them (`clear_streams`), and the next request, on another
        thread, could then not evaluate it ("There is no Stream ... in current thread")."""
        from mlx.utils import tree_flatten

        kept = [self.target.arrays()] + [d.arrays() for d in self.drafters.values() if hasattr(d, "arrays")]
        mx.eval([v for _, v in tree_flatten(kept) if isinstance(v, mx.array)])

    def thread_ending(self) -> None:
        """A thread that ran a generation is ending (`device.clear_streams_at_thread_exit`): what
        the engine keeps is evaluated now, on that thread's streams, unless another thread runs
        it. A stream it left suspended can then resume, and later requests run, on any thread."""
        if self.occupancy.try_enter():
            try:
                self.materialize()
            finally:
                self.occupancy.leave()

    # -- public API ---------------------------------------------------------------------------
    def generate(self, prompt, **kwargs) -> GenerationResult:
        """Generate to completion; same keywords as `stream`. Returns a GenerationResult: tokens,
        text, finish_reason ("stop", "length", or "cancelled" when `cancel` was set), stats, and
        from_draft (per token, whether a draft proposed it), with `logprobs` the per-token
        logprobs and top_logprobs, and with `prompt_logprobs` the prompt's."""
        tokens, pieces, from_draft, lps, tops = [], [], [], [], []
        reason = "length"
        stats = scored = why = None
        ended = None
        for ev in self.stream(prompt, **kwargs):
            scored = scored or ev.prompt_logprobs
            why = ev.stop_reason
            tokens.append(ev.token)
            pieces.append(ev.text)
            from_draft.append(ev.from_draft)
            lps.append(ev.logprob)
            tops.append(ev.top_logprobs)
            stats = ev.stats
            ended = ev.finish_reason
        cancel = kwargs.get("cancel")
        reason = ended or ("cancelled" if cancel is not None and cancel.is_set() else reason)
        asked = kwargs.get("logprobs") is not None
        return GenerationResult(tokens, "".join(pieces), reason, stats or self.last_stats, from_draft,
                                lps if asked else None, tops if asked else None, scored, why)

    def stream(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, min_p: float = 0.0, typical_p: float = 1.0, top_n_sigma: float = 0.0,
               xtc_probability: float = 0.0, xtc_threshold: float = 0.1, mirostat: int = 0,
               mirostat_tau: float = 5.0, mirostat_eta: float = 0.1, seed: Optional[int] = None,
               speculative: bool = True,
               num_draft=None, stop=None, drafter: Optional[str] = None, tree=None,
               lookup: Optional[bool] = None, cancel=None, tools=None, logprobs: Optional[int] = None,
               response_format=None, tool_choice=None, chat_template_kwargs=None, logit_bias=None,
               presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repetition_penalty=None,
               repetition_context_size: int = 20, dry_multiplier: float = 0.0, dry_base: float = 1.75,
               dry_allowed_length: int = 2, dry_penalty_last_n: int = -1, dry_sequence_breakers=None,
               stop_token_ids=None, ignore_eos: bool = False, min_tokens: int = 0,
               prompt_logprobs: Optional[int] = None, suffix: Optional[str] = None,
               include_stop_str_in_output: bool = False, continue_final_message: bool = False,
               parallel_tool_calls: bool = True, prediction=None, post_sampling_probs: bool = False,
               min_indent: int = 0, soft_time_limit: Optional[float] = None, **other) -> Iterator[TokenEvent]:
        """Yield one TokenEvent per generated token. Arguments are checked before anything runs.

        Args:
            prompt: str (used as is), list of token ids, or chat messages (chat template applied).
            max_tokens: at most this many tokens (default 256); fewer when the model's context
                fills first (finish_reason "length"; no limit with a sliding window below it).
            temperature, top_p, top_k, min_p: sampling (default greedy); applied to target and draft alike.
            typical_p: locally typical sampling's mass, in (0, 1] (1, the default, disables it).
            top_n_sigma: llama.cpp's top-n-sigma: the tokens whose logit is at least the top one
                less that many standard deviations of the logits (0 or less, the default: off).
            xtc_probability, xtc_threshold: XTC (mlx-lm's and llama.cpp's "exclude top choices"):
                at each position, with that probability (0, the default, disables it), every token
                above the threshold (in [0, 0.5], default 0.1) but the least likely of them is
                dropped; newline and EOS never are. Which positions it fires at is a function of
                the seed, so a seeded answer is still plain decoding's whatever was drafted.
            mirostat, mirostat_tau, mirostat_eta: llama.cpp's (and Ollama's) mirostat, version 1 or
                2 (0, the default: off), in place of the filters above: it aims at tau bits of
                surprise (default 5) with a threshold that moves by eta (default 0.1) per token
                (`mlxspec.mirostat`). Rounds then draft chains.
            seed: makes sampling reproducible; None uses MLX's global random state.
            speculative: False decodes plainly (drafter "none").
            num_draft: fixed draft length, or None/"auto" for the engine's setting (cost model by default).
            stop: a string or list of strings; the text is cut before the first one found (the
                last event's `stop_reason` says which).
            include_stop_str_in_output: vLLM's: the text ends with the stop string found instead.
            drafter: override the engine's default drafter for this request.
            tree: None for the engine's setting (default "auto": the cost model sizes draft trees),
                "auto", "off" (chains only), or an int N capping what a round drafts at N tokens
                (unused with a fixed num_draft: every round is then a chain).
            lookup: None for the engine's setting (default True); whether a model drafter's
                rounds may draft by prompt lookup instead, and its chains copy
                (see `Engine`).
            cancel: a threading.Event (anything with `is_set()`) another thread may set: the
                generation then ends as if its stream were closed, also between two chunks of a
                long prompt, before any token (what was fed stays cached for the next request).
                The stream then just ends, with no last event carrying a finish_reason;
                `generate` returns what it had, with finish_reason "cancelled".
            tools: OpenAI-style function tools ([{"type": "function", "function": {"name", "description",
                "parameters"}}]) for the chat template to show the model; needs chat messages and a
                template that renders tools. The calls come back as text, in the model's own format
                (`Engine.tool_format` says which; the server turns them into `tool_calls`).
            logprobs: None (default), or each event also carries `logprob`, the target's
                log-probability of its token (of the raw logits: before temperature and the
                filters, as mlx-lm reports it), and `top_logprobs`, that many (0..1000) of the
                best (token, logprob) of its position. Computed in the pass that picks the token.
            post_sampling_probs: llama.cpp's: with `logprobs`, they are of the distribution each token
                was drawn from (after temperature, the filters, penalties and logit_bias; greedy:
                the chosen token's 0, every other -inf), not of the raw logits.
            prompt_logprobs: None (default), or the first event also carries `prompt_logprobs`:
                per prompt token (token, log-probability given the tokens before it, that many
                (0..1000) best (token, logprob) there), the first token's log-probability None
                (vLLM's; OpenAI's echo with logprobs). The prompt's every row is then computed:
                its prefill takes nothing from a cache.
            suffix: None (default), or fill in the middle: `prompt` (a string) is the text before
                the insertion point and `suffix` the text after it, laid out with the model's own
                fill-in-the-middle markers (`Engine.fim_format`; a model without them is refused),
                and the model writes what goes between, ending at its end-of-middle tokens too.
            response_format: None or {"type": "text"} (free text), or a grammar every token
                follows, in OpenAI's shapes: {"type": "json_object"}, {"type": "json_schema",
                "json_schema": {"name": ..., "schema": {...}}}; beyond OpenAI's, {"type": "regex",
                "regex": ...}, {"type": "choice", "choice": [...]} and {"type": "lark", "lark": ...}
                (see `mlxspec.grammar`). Output stays the constrained target's; rounds then draft
                chains, and plain steps wait for their predecessor's token. Where the chat template
                opened a thinking block at the end of the prompt, the grammar applies after it closes.
            tool_choice: with `tools`, None or "auto" (the model decides), "none" (the tools are
                not shown), "required" (the answer is one or more calls) or {"type": "function",
                "function": {"name": ...}} (one call of that function), forced by a grammar in the
                model's call format (Qwen2.5's and Hermes' <tool_call> JSON), its arguments
                following the tool's parameters schema; or {"type": "allowed_tools",
                "allowed_tools": {"mode": "auto" or "required", "tools": [{"type": "function",
                "function": {"name": ...}}, ...]}}: that mode over those tools, the others not shown.
            parallel_tool_calls: OpenAI's: True (default), the model writes the calls it writes;
                False, one call at most: a forced call's grammar writes one, and in free text the
                answer ends with the first call's end marker (a format whose calls share one body,
                as Mistral's list does, may still hold several: the server reads the first alone).
            prediction: None, or what the answer is expected to largely repeat (OpenAI's Predicted
                Outputs: a file being edited, a text being corrected), as a string or token ids.
                Rounds draft from it where the answer's tail matches it (the n-gram drafter's, or a
                model drafter's lookup rounds); the output is the target's all the same. The last
                event's stats count its tokens that appear in the answer (`prediction_accepted`)
                and the rest (`prediction_rejected`).
            continue_final_message: the answer continues the last message, the assistant's (a
                prefill: the template renders no new turn; vLLM's, and what Anthropic's API does
                with a last assistant message); needs chat messages.
            chat_template_kwargs: extra variables for the chat template, e.g. {"enable_thinking":
                False} for Qwen3's (needs chat messages).
            logit_bias: OpenAI's {token id: bias in [-100, 100]}, added to the target's logits
                before sampling and greedy's argmax (-100 bans the token); output stays that
                biased target's, whatever drafts.
            presence_penalty, frequency_penalty: OpenAI's, in [-2, 2]: a token's logit drops by
                frequency x its count in the answer so far + presence x (count > 0), at every
                row of every pass as plain decoding would have it there (rounds then draft chains).
            repetition_penalty, repetition_context_size: mlx-lm's: the logits of the tokens among
                the last `repetition_context_size` (prompt included) are divided by the penalty
                where positive, multiplied where negative (None, 0 or 1: off), row by row alike.
            dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers:
                llama.cpp's DRY (`mlxspec.dry`): where the text ends with a repeat of n >=
                dry_allowed_length tokens (default 2), the token that followed it before loses
                dry_multiplier (0, the default: off) x dry_base (default 1.75) ** (n -
                dry_allowed_length) of its logit; the look-back is the last dry_penalty_last_n
                tokens (-1, the default: all; 0: off), and repeats never run across a token whose
                text holds a breaker string (None: newline, ":", '"', "*"). Plain steps then wait
                for their predecessor's token (DRY reads it on the host).
            stop_token_ids, ignore_eos, min_tokens: vLLM's: more token ids that end the answer as
                EOS does (not shown in the text); the model's EOS does not end it; before
                `min_tokens` tokens, the ones that would end it are banned (unless a response_format
                allows nothing else: it is complete, and the answer ends).
            min_indent, soft_time_limit: llama.cpp's n_indent and t_max_predict_ms, for
                completions at an editor's cursor, each ending the answer with finish_reason
                "length": a line after the first whose first character other than spaces and
                tabs comes after fewer than `min_indent` of them ends it before that character
                (the cursor's indentation keeps the completion in its block; a blank line decides
                nothing); after `soft_time_limit` seconds of generation (the prompt's not
                counted), the next line end ends it (whole lines soon, not a long answer late).
        """
        check_no_other_options(other, STREAM_OPTIONS)
        # every keyword by name (the signature above is the contract); `cancel` stays on this rank
        options = {name: value for name, value in locals().items() if name in STREAM_OPTIONS and name != "cancel"}
        cancel = check_cancel(cancel)
        request, constraint = check_request(self, prompt, **options)
        if self.coord.active:
            # A tree's shape is pruned by each rank's own cost model; rank 0 broadcasts only a
            # chain's length, so sharded targets verify chains.
            request["tree"] = 0
            if request["seed"] is None:  # one seed for every rank: the sampled tokens must agree
                request["seed"] = draw_seed()
            request["params"] = astuple(request["params"])
            return self._shared(request, cancel)
        return self._run(**request, cancel=cancel, constraint=constraint)

    def embed(self, inputs, *, pooling: str = "mean", normalize: int = 2, truncate: bool = False,
              cancel=None) -> Optional[Embeddings]:
        """The target's embeddings of `inputs`: its final hidden states pooled (`mlxspec.embed`).

        Args:
            inputs: a string, a list of token ids, or a list of strings or token-id lists (one
                vector each); strings are encoded as prompts are (no chat template).
            pooling: "mean" (default: every position averaged, llama.cpp's for generative
                models) or "last" (the last position: decoder-based embedding models).
            normalize: llama.cpp's embd_normalize: 2 (default: unit length, as OpenAI's), -1
                none, 0 max absolute scaled to the int16 range, 1 taxicab, p > 2 p-norm.
            truncate: an input past the context keeps its first tokens (Ollama's) instead of
                raising ContextLengthError.
            cancel: as `stream`'s: when set, the call stops between two chunks and returns None.

        Returns:
            Embeddings: `vectors` (N, H) float32 in the inputs' order, `tokens` per input. The
            caches are not touched: an open stream may go on after it.
        """
        pooling, normalize, cancel = check_pooling(pooling), check_normalize(normalize), check_cancel(cancel)
        ids = self.embedding_inputs(inputs, truncate=truncate)
        self.occupancy.enter()
        try:
            if self.coord.active:  # every rank runs the same passes (rank 0's inputs); rank 0 alone could not
                shared = self.coord.share({"embed": ids, "pooling": pooling})
                ids, pooling = shared["embed"], shared["pooling"]
                cancel = None  # stopping on rank 0 only would leave the others a pass behind
            vectors = self._pooled(ids, pooling, cancel)
        finally:
            self.occupancy.leave()
        return None if vectors is None else Embeddings(normalized(vectors, normalize), [len(i) for i in ids])

    def embedding_inputs(self, inputs, *, truncate: bool = False) -> List[List[int]]:
        """The token ids `embed` reads for `inputs` (checked, cut to the context with `truncate`)."""
        return encode_inputs(inputs, self.tokenizer, self.vocab_size, self.context or context_length(self.target_model),
                             truncate=bool(truncate))

    def _pooled(self, ids, pooling: str, cancel=None) -> Optional[mx.array]:
        if self._backbone is None:  # checked once: backbone + head must reproduce the model's logits
            self._backbone = split_model(self.target_model)[0]
        return pooled(self._backbone, self.target_model, ids, pooling, step=self.prefill_step, cancel=cancel)

    @functools.cached_property
    def xtc_special(self) -> tuple:
        """The tokens XTC never drops, as mlx-lm has them: the newline's and EOS (an answer XTC made
        unable to end a line or itself would run on)."""
        if self.tokenizer is None:
            return ()
        eos = getattr(self.tokenizer, "eos_token_ids", None) or []
        return tuple(sorted({*self.tokenizer.encode("\n", add_special_tokens=False), *eos}))

    @functools.cached_property
    def fim_format(self) -> Optional[FimFormat]:
        """The model's fill-in-the-middle markers (`mlxspec.fim`), or None when it has none."""
        return fim_format(self.tokenizer)

    def constraint(self, fmt: Optional[dict], think_end: Optional[List[int]] = None, refused=()):
        """A fresh grammar state for a checked response_format (None for free text); with
        `think_end`, one that applies after those tokens (`grammar.AfterThinking`); `refused`: the
        tokens a logit_bias bans (`sampling.banned`), which no row allows."""
        if fmt is None:
            return None
        if self.tokenizer is None:
            raise InvalidArgumentError("response_format needs the model's tokenizer, and this engine has none")
        eos = getattr(self.tokenizer, "eos_token_ids", None) or []
        constraint = Constraint(fmt, self.prepare_grammar(), eos, self.vocab_size, refused)
        return constraint if think_end is None else AfterThinking(constraint, think_end)

    def prepare_grammar(self):
        """Build the grammar engine's view of the vocabulary now (a server does at start), not on
        the first response_format (about a second for a 150k vocabulary). Returns it."""
        if self._grammar_table is None and self.tokenizer is not None:
            self._grammar_table = token_table(self.tokenizer, getattr(self.tokenizer, "eos_token_ids", None) or [])
        return self._grammar_table

    @functools.cached_property
    def tool_format(self) -> Optional[ToolFormat]:
        """How this model writes tool calls (markers and parser, from its chat template), or None."""
        return tool_format(self.tokenizer)

    def follow(self) -> int:
        """Run rank 0's requests until it calls `release()` (ranks other than 0, e.g. behind a server).

        Returns the number of requests run. Rank 0 calls `stream`/`generate` as usual.
        """
        count = 0
        while (request := self.coord.share(None)) is not None:
            if "embed" in request:
                self._pooled(request["embed"], request["pooling"])
                count += 1
                continue
            for _ in self._run(**dict(request, params=SamplingParams(*request["params"]))):
                pass
            count += 1
        return count

    def release(self) -> None:
        """Rank 0: end the other ranks' `follow()`. A no-op in a single process."""
        if self.coord.active and self.coord.is_main:
            self.coord.share(None)

    def _shared(self, request: dict, cancel=None) -> Iterator[TokenEvent]:
        # Lazily, like `generate`: the request is shared when iteration starts, on every rank alike.
        # (`cancel` stays on rank 0, which tells the others when it ends the request.)
        request = self.coord.share(request)
        mine = cancel if self.coord.is_main else None  # another rank's would leave it out of step
        yield from self._run(**dict(request, params=SamplingParams(*request["params"])), cancel=mine)

    def _run(self, *, ids, params, max_tokens, seed, name, k_fixed, stop, tree, lookup=False,
             cancel=None, logprobs=None, response_format=None, constraint=None,
             logit_bias=None, penalty=None, endings=None, prompt_logprobs=None,
             think_end=None, include_stop=False, prediction=None, post_sampling=False) -> Iterator[TokenEvent]:
        if constraint is None:  # a rank other than 0 builds its own from the shared request
            constraint = self.constraint(response_format, think_end, banned(logit_bias))
        stats = GenerationStats(prompt_tokens=len(ids), drafter=name, temperature=params.temperature,
                                kernels=kernels.backend_name(), target_weights_bytes=self.target_weights_bytes,
                                draft_weights_bytes={"model": self.draft_weights_bytes,
                                                     "eagle": self.eagle_weights_bytes}.get(name, 0))
        return generate(self, ids, params, max_tokens=max_tokens, seed=seed, name=name, k_fixed=k_fixed,
                        stop=stop, stats=stats, tree=tree, lookup=lookup, cancel=cancel, logprobs=logprobs,
                        constraint=constraint, bias=bias_row(logit_bias, self.vocab_size) if logit_bias else None,
                        penalties=self._penalties(penalty) if penalty else None,
                        prompt_logprobs=prompt_logprobs, include_stop=include_stop, prediction=prediction,
                        post_sampling=post_sampling, **(endings or {}))

    def _penalties(self, penalty: dict) -> Penalties:
        """A checked request's penalties (`request.check_request`), DRY's breakers as token ids."""
        dry = penalty.get("dry")
        if dry is not None:
            dry = Dry(dry["multiplier"], dry["base"], dry["allowed_length"], dry["last_n"],
                      breaking_tokens(self.token_texts, dry["breakers"]))
        return Penalties(self.vocab_size, **dict(penalty, dry=dry))

    @functools.cached_property
    def token_texts(self) -> List[str]:
        """Each token id's text, decoded alone (`text.token_texts`), for DRY's breakers."""
        return token_texts(self.tokenizer, self.vocab_size)

    def finish_stats(self, stats: GenerationStats, name: str) -> None:
        """Memory figures of a finished (or abandoned) generation."""
        # At least what is held now: a generation stopped before it allocated anything has a peak
        # of 0 since the loop's reset, though the weights and caches are there.
        stats.peak_memory_bytes = int(max(mx.get_peak_memory(), mx.get_active_memory()))
        stats.target_kv_bytes = self.target.kv_bytes
        stats.parked_kv_bytes = self.prompt_cache.nbytes
        if name == "model":
            stats.draft_kv_bytes = self.drafters["model"].seq.kv_bytes
        elif name == "eagle":
            stats.draft_kv_bytes = self.drafters["eagle"].kv_bytes


# What `stream` (and so `generate`) takes besides the prompt: said when something else is passed.
STREAM_OPTIONS = [name for name, p in inspect.signature(Engine.stream).parameters.items()
                  if name not in ("self", "prompt") and p.kind is p.KEYWORD_ONLY]
