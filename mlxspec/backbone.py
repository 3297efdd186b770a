"""An mlx-lm model as backbone + head, so one pass gives the final hidden states and the logits.

mlx-lm's causal LMs compute `logits = head(model.model(tokens, cache))`, where `model.model`
returns the last layer's hidden states after the final norm and `head` is `model.lm_head` or,
with tied embeddings, `model.model.embed_tokens.as_linear`. Feature-level drafters read those
hidden states; splitting the call lets a verify pass return them without a second pass.
Models whose `__call__` does more than that (logit soft-capping, scaled heads) are refused:
`split_model` checks on one token that backbone + head reproduce the model's own logits.
"""

from __future__ import annotations

from typing import Callable, Tuple

import mlx.core as mx

from .errors import IncompatibleModelsError


def split_model(model, *, check: bool = True) -> Tuple[Callable, Callable]:
    """(backbone, head): `backbone(tokens (1, S), cache) -> hidden (1, S, H)`, `head(hidden) -> logits`.

    Args:
        model: an mlx-lm causal LM.
        check: run one token through both paths and require identical logits. Default True.

    Raises:
        IncompatibleModelsError: the model has no `model` backbone, or its logits are not
            a plain linear head of the backbone's output.
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
    if check:
        x = mx.array([[1]], dtype=mx.uint32)
        same = mx.array_equal(head(backbone(x)), model(x)).item()
        if not same:
            raise IncompatibleModelsError(
                f"[backbone] {name}'s logits are not its backbone's hidden states through a linear head "
                "(soft-capping or scaling in __call__); feature-level drafting needs a plain head")
    return backbone, head


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
