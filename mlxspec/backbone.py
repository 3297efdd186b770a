"""An mlx-lm model as backbone + head, so one pass gives the final hidden states and the logits.

mlx-lm's causal LMs compute `logits = head(model.model(tokens, cache))`, where `model.model`
returns the last layer's hidden states after the final norm and `head` is `model.lm_head` or,
with tied embeddings, `model.model.embed_tokens.as_linear`. Feature-level drafters read those
hidden states; splitting the call lets a verify pass return them without a second pass.
Some families map that linear output once more: Gemma 2 soft-caps it (`tanh(x / c) * c`), Granite
divides it by a scale and Cohere multiplies it by one. `logit_map` names that map, the head
applies it, and a drafter reading the same output rows applies it too. Any other `__call__` is
refused: `split_model` checks on one token that backbone + head reproduce the model's own logits.
`tapped` also returns the outputs of chosen blocks from the same pass (EAGLE-3's features).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Optional, Sequence as Seq, Tuple

import mlx.core as mx

from .errors import IncompatibleModelsError
from .retype import override_call

TAP_EPS = 1e-5  # tapped layer outputs are RMS-normalised (no weight) with this epsilon, here and in training


@dataclass(frozen=True)
class LogitMap:
    """What a family's `__call__` does to its linear head's output: "softcap" (`tanh(x / value) *
    value`, Gemma 2), "divide" (Granite) or "multiply" (Cohere). Each is increasing, so the top
    token and the order of the others are the linear output's. Hashable: compiled calls key on it."""

    kind: str
    value: float

    def __call__(self, x: mx.array) -> mx.array:
        # The same ops in the same order as mlx-lm's models, so the split head is bit-exact.
        if self.kind == "softcap":
            return mx.tanh(x / self.value) * self.value
        if self.kind == "divide":
            return x / self.value
        return x * self.value


# model_type -> (the kind of map, where its value lives: an attribute of the model or of its args)
LOGIT_MAPS = {"gemma2": ("softcap", "final_logit_softcapping"),
              "granite": ("divide", "logits_scaling"), "granitemoe": ("divide", "logits_scaling"),
              "cohere": ("multiply", "logit_scale"), "cohere2": ("multiply", "logit_scale")}


def logit_map(model) -> Optional[LogitMap]:
    """The map the model applies after its linear head, or None (a plain head, or a family
    without one; `split_model` still checks the result)."""
    args = getattr(model, "args", None)
    known = LOGIT_MAPS.get(getattr(args, "model_type", None))
    if known is None:
        return None
    kind, field = known
    value = getattr(model, field, None)
    if value is None:
        value = getattr(args, field, None)
    return LogitMap(kind, float(value)) if value else None


def split_model(model, *, check: bool = True) -> Tuple[Callable, Callable]:
    """(backbone, head): `backbone(tokens (1, S), cache) -> hidden (1, S, H)`, `head(hidden) -> logits`
    (the linear head, then the family's `logit_map` where it has one).

    Args:
        model: an mlx-lm causal LM.
        check: run one token through both paths and require identical logits. Default True.

    Raises:
        IncompatibleModelsError: the model has no `model` backbone, or its logits are not
            a linear head of the backbone's output (mapped by its `logit_map`).
    """
    name = type(model).__module__.rsplit(".", 1)[-1]
    backbone = getattr(model, "model", None)
    if backbone is None or not callable(backbone):
        raise IncompatibleModelsError(f"[backbone] {name} has no `model` backbone; hidden states are unavailable")
    if "lm_head" in model:
        head = model.lm_head
    elif hasattr(getattr(backbone, "embed_tokens", None), "as_linear"):
        head = backbone.embed_tokens.as_linear
    else:
        raise IncompatibleModelsError(f"[backbone] {name} has neither `lm_head` nor tied `embed_tokens`")
    post = logit_map(model)
    if post is not None:
        linear = head

        def head(h):
            return post(linear(h))
    if check:
        x = mx.array([[1]], dtype=mx.uint32)
        same = mx.array_equal(head(backbone(x)), model(x)).item()
        if not same:
            raise IncompatibleModelsError(
                f"[backbone] {name}'s logits are not its backbone's hidden states through a linear head, "
                f"nor that head soft-capped or scaled as {', '.join(sorted(LOGIT_MAPS))} do; feature-level "
                "drafting needs a plain head, or one mapped as theirs are")
    return backbone, head


def layers_fit(layers, n: int) -> bool:
    """Whether `layers` are distinct block indices of a backbone of `n` blocks: the one rule for
    feature layers, applied where a list enters (the training CLI, a head's config, `tapped`)."""
    return (isinstance(layers, (list, tuple))
            and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in layers)
            and len(set(layers)) == len(layers))


def tapped(model, layers: Seq[int]) -> Callable:
    """`backbone(tokens (1, S), cache) -> (hidden (1, S, H), taps (1, S, len(layers) * H))`: the
    final hidden states and the outputs of the backbone's blocks `layers` (0-based), each
    RMS-normalised without a weight (their scales differ by orders of magnitude) and
    concatenated: the features an EAGLE-3-style head reads, from the same pass.

    The blocks record their outputs through a subclass of their own class (the same
    parameters, names and cache), and only inside `run`, in a per-thread record: a shared
    model called elsewhere (the chat's vanilla side) keeps nothing.

    Raises:
        IncompatibleModelsError: no layers, a repeated one, or one outside the backbone.
    """
    backbone, _ = split_model(model, check=False)
    blocks = getattr(backbone, "layers", None)
    n = len(blocks) if blocks is not None else 0
    if not layers or not layers_fit(list(layers), n):
        raise IncompatibleModelsError(f"[backbone] feature layers {list(layers)} do not fit a backbone of {n} blocks "
                                      f"(allowed: distinct indices 0..{n - 1})")
    taps = [blocks[i] for i in layers]
    for block in taps:
        _tap(block)

    def run(tokens: mx.array, cache=None):
        _RECORD.out = outs = {}
        try:
            h = backbone(tokens, cache)
        finally:
            _RECORD.out = None
        parts = [outs[id(b)] for b in taps]
        return h, mx.concatenate([mx.fast.rms_norm(x, None, TAP_EPS) for x in parts], axis=-1)

    return run


_RECORD = threading.local()  # .out: {id(block): output} while this thread is inside a tapped run, else None


def _record(block, call, *args, **kwargs):
    out = call(*args, **kwargs)
    record = getattr(_RECORD, "out", None)
    if record is not None:
        record[id(block)] = out
    return out


def _tap(block) -> None:
    override_call(block, _record, "_mlxspec_tap")


def output_rows(model, ids: mx.array) -> mx.array:
    """The output head's rows for token `ids` (N,), dequantized: (N, H), so `hidden @ rows.T` are
    those tokens' logits. The head is `lm_head` where the model has one (untied embeddings, as in
    Llama 3 8B or Qwen2.5 7B), else the tied input embedding."""
    ids = ids.astype(mx.uint32)
    head = model.lm_head if "lm_head" in model else None
    if head is None:
        return model.model.embed_tokens(ids)  # nn.Embedding or QuantizedEmbedding: dequantized rows
    if "scales" in head:  # QuantizedLinear: dequantize only the rows asked for
        biases = head["biases"][ids] if "biases" in head else None
        return mx.dequantize(head.weight[ids], head.scales[ids], biases, group_size=head.group_size,
                             bits=head.bits, mode=getattr(head, "mode", "affine"))
    return head.weight[ids]


def hidden_size(model) -> int:
    """Width of the backbone's hidden states."""
    args = getattr(model, "args", None)
    h = getattr(args, "hidden_size", None)
    if h is None:
        backbone, _ = split_model(model, check=False)
        h = backbone(mx.array([[1]], dtype=mx.uint32)).shape[-1]
    return int(h)
