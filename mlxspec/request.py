"""A request's arguments, checked before anything runs: `Engine.stream`'s keywords become the
prompt's token ids and the settings the loop runs (`Engine._run`'s keywords). Every check raises
`InvalidArgumentError` (or `ContextOverflowError`) saying what was wrong and what is allowed,
before a token is computed; with a sharded target, rank 0 checks and shares the result."""

from __future__ import annotations

from typing import Optional, Tuple

from .dry import check_dry
from .errors import InvalidArgumentError
from .fim import check_suffix, fim_prompt
from .grammar import JSON_OPTIONS, check_response_format
from .logprobs import check_logprobs
from .penalties import check_penalty, check_repetition
from .prediction import check_prediction
from .prompts import (check_drafter, check_endings, check_fits, check_line_limits, check_lookup, check_max_tokens,
                      check_num_draft, check_seed, check_stop, check_template_kwargs, check_tree, encode_prompt)
from .reasoning import thinking_end
from .sampling import SamplingParams, banned, check_logit_bias
from .tools import call_grammar, calls_or_answer, check_tool_choice, check_tools, forced_tools, narrowed


def check_request(engine, prompt, *, max_tokens, temperature, top_p, top_k, min_p, typical_p, top_n_sigma,
                  xtc_probability, xtc_threshold, mirostat, mirostat_tau, mirostat_eta, seed, speculative, num_draft,
                  stop, drafter, tree, lookup, tools, logprobs, response_format, tool_choice, chat_template_kwargs,
                  logit_bias, presence_penalty, frequency_penalty, repetition_penalty, repetition_context_size,
                  dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers,
                  stop_token_ids, ignore_eos, min_tokens, prompt_logprobs, suffix, include_stop_str_in_output,
                  continue_final_message, parallel_tool_calls, prediction, post_sampling_probs, min_indent=0,
                  soft_time_limit=None) -> Tuple[dict, Optional[object]]:
    """`engine.stream`'s arguments, checked (see its docstring for each). Returns the request (what
    `Engine._run` takes, shareable between ranks) and the grammar state for its response_format
    (None for free text), built now so a schema the compiler refuses is said first."""
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, typical_p=typical_p,
                            xtc_probability=xtc_probability, xtc_threshold=xtc_threshold,
                            xtc_special=engine.xtc_special if xtc_probability else (), mirostat=mirostat,
                            mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta, top_n_sigma=top_n_sigma)
    max_tokens = check_max_tokens(max_tokens)
    k_fixed = check_num_draft(num_draft) if num_draft is not None else engine.num_draft
    tree = check_tree(tree) if tree is not None else engine.tree
    lookup = check_lookup(lookup) if lookup is not None else engine.lookup
    stop = check_stop(stop)
    for flag, value in (("speculative", speculative), ("include_stop_str_in_output", include_stop_str_in_output),
                        ("continue_final_message", continue_final_message),
                        ("parallel_tool_calls", parallel_tool_calls), ("post_sampling_probs", post_sampling_probs)):
        if not isinstance(value, bool):
            raise InvalidArgumentError(f"{flag} must be True or False, got {value!r}")
    seed = check_seed(seed)
    logprobs = check_logprobs(logprobs)
    prompt_logprobs = check_logprobs(prompt_logprobs, "prompt_logprobs")
    fmt = check_response_format(response_format)
    bias = check_logit_bias(logit_bias, engine.vocab_size)
    penalty = dict(presence=check_penalty(presence_penalty, "presence_penalty"),
                   frequency=check_penalty(frequency_penalty, "frequency_penalty"))
    penalty["repetition"], penalty["context"] = check_repetition(repetition_penalty, repetition_context_size)
    penalty["dry"] = check_dry(dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n,
                               dry_sequence_breakers)
    if not (penalty["presence"] or penalty["frequency"] or penalty["repetition"] or penalty["dry"]):
        penalty = None
    endings = dict(zip(("stop_ids", "ignore_eos", "min_tokens"),
                       check_endings(stop_token_ids, ignore_eos, min_tokens, max_tokens, engine.vocab_size)))
    endings.update(check_line_limits(min_indent, soft_time_limit))
    given = tools = check_tools(tools)
    tools, choice = narrowed(tools, check_tool_choice(tool_choice, tools))
    forcing = choice not in (None, "auto", "none")  # a call the grammar writes
    if choice == "none":
        tools = None
    if drafter is not None and drafter not in engine.drafters:  # also when speculative=False ignores it
        check_drafter(drafter)  # a name that is no drafter at all is told so first
        raise InvalidArgumentError(f"drafter {drafter!r} is not available on this engine; allowed: "
                                   f"{', '.join(engine.drafters)}")
    name = "none" if not speculative else (drafter or engine.default_drafter)  # the default is always there
    template_kwargs = check_template_kwargs(chat_template_kwargs)
    if check_suffix(suffix, prompt) is None:
        ids = encode_prompt(prompt, engine.tokenizer, engine.vocab_size, tools=tools, template_kwargs=template_kwargs,
                            continue_final=continue_final_message)
    else:
        ids = fim_prompt(engine.fim_format, engine.tokenizer, prompt, suffix, engine.vocab_size,
                         chat_only=bool(tools or template_kwargs or continue_final_message))
        endings["stop_ids"] = sorted(set(endings["stop_ids"]) | set(engine.fim_format.ends))
    check_fits(len(ids), engine.context)
    predicted = check_prediction(prediction, engine.tokenizer, engine.vocab_size)
    one = tools is not None and not parallel_tool_calls  # one call at most
    if forcing:  # (after the prompt: a template that ignores tools is said first); a response_format
        # is then for a later answer: this one is the calls
        fmt = _calls_checked(call_grammar(engine.tool_format, tools, choice, JSON_OPTIONS, engine.tokenizer, one=one),
                             given, forced_tools(tools, choice))
    elif tools and fmt is not None:  # the model chooses: calls, or an answer in the format
        fmt = _calls_checked(calls_or_answer(engine.tool_format, tools, fmt, JSON_OPTIONS, one=one), given, tools)
    elif one and engine.tool_format is not None:  # free text: it ends where its first call does
        endings["end_after"] = engine.tool_format.end
    # a grammar applies after the thinking block, except harmony's calls, whose grammar reads the analysis
    harmony_call = forcing and engine.tool_format.name == "harmony"
    think_end = thinking_end(engine.tokenizer, ids) if fmt is not None and not harmony_call else None
    constraint = engine.constraint(fmt, think_end, banned(bias))
    request = dict(ids=ids, params=params, max_tokens=max_tokens, seed=seed, name=name,
                   k_fixed=k_fixed, stop=stop, tree=tree, lookup=lookup, logprobs=logprobs,
                   response_format=fmt, logit_bias=bias, penalty=penalty, endings=endings,
                   prompt_logprobs=prompt_logprobs, think_end=think_end,
                   include_stop=include_stop_str_in_output, prediction=predicted, post_sampling=post_sampling_probs)
    return request, constraint


def _calls_checked(grammar: dict, given, called) -> dict:
    """A grammar that writes calls of the `called` tools, checked. Where it is refused, the tool
    whose `parameters` schema is to blame is named by its place in the request's `tools` (`given`),
    not as a response_format the request never sent."""
    try:
        return check_response_format(grammar)
    except InvalidArgumentError:
        names = {t["function"]["name"] for t in called}
        for i, tool in enumerate(given):
            schema = tool["function"].get("parameters")
            if tool["function"]["name"] in names and schema:
                check_response_format({"type": "json_schema", "json_schema": {"schema": schema}},
                                      f"tools[{i}].function.parameters")
        raise
