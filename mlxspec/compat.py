"""Can a draft model propose tokens for a target? llama.cpp's vocabulary rule.

Speculative decoding compares draft and target token ids directly, so the ids must mean the
same text. Following llama.cpp (`common_speculative_are_compatible`): same tokenizer kind,
same BOS and EOS ids, vocabulary sizes within VOCAB_SLACK of each other, and identical token
text for every id both have. Embedding (logit) widths may differ -- Qwen2.5-7B pads to
152064 rows, its 0.5B draft to 151936 -- since the extra rows are never reached by a token.

Works on mlx-lm `TokenizerWrapper`s and on Hugging Face tokenizers (anything with
`get_vocab()`, `bos_token_id`, `eos_token_id`).
"""

from __future__ import annotations

from .errors import IncompatibleModelsError

VOCAB_SLACK = 128  # llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE


def check_tokenizers(target, draft) -> None:
    """Raise IncompatibleModelsError unless `draft` may draft for `target` (see module docstring)."""
    kind_t, kind_d = tokenizer_kind(target), tokenizer_kind(draft)
    if kind_t != kind_d:
        raise IncompatibleModelsError(
            f"tokenizer kinds differ: target {kind_t}, draft {kind_d}; target and draft must share a tokenizer"
        )
    for name in ("bos_token_id", "eos_token_id"):
        t, d = getattr(target, name, None), getattr(draft, name, None)
        if t != d:
            raise IncompatibleModelsError(
                f"{name} differs: target {t}, draft {d}; target and draft must share special tokens"
            )
    vocab_t, vocab_d = _id_to_token(target), _id_to_token(draft)
    size_t, size_d = len(vocab_t), len(vocab_d)
    if abs(size_t - size_d) > VOCAB_SLACK:
        raise IncompatibleModelsError(
            f"vocabulary sizes differ by {abs(size_t - size_d)} (target {size_t}, draft {size_d}); "
            f"at most {VOCAB_SLACK} is allowed"
        )
    for i in sorted(vocab_t.keys() & vocab_d.keys()):
        if vocab_t[i] != vocab_d[i]:
            raise IncompatibleModelsError(
                f"token {i} differs: target {vocab_t[i]!r}, draft {vocab_d[i]!r}; every id both "
                "vocabularies have must map to the same text"
            )


def check_logit_widths(target_vocab: int, draft_vocab: int) -> None:
    """Without tokenizers, the only evidence is the logit width: it must be equal.

    Raises:
        IncompatibleModelsError: the widths differ.
    """
    if int(target_vocab) != int(draft_vocab):
        raise IncompatibleModelsError(
            f"logit widths differ (target {target_vocab}, draft {draft_vocab}) and no tokenizers "
            "were given to show the vocabularies agree; pass both tokenizers, or use a draft with "
            "the same vocabulary"
        )


def tokenizer_kind(tokenizer) -> str:
    """The tokenization algorithm, e.g. "BPE", "Unigram", "WordPiece" (else the class name)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    model = getattr(backend, "model", None)
    if model is not None:
        return type(model).__name__
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    return type(inner).__name__


def _id_to_token(tokenizer) -> dict[int, str]:
    return {i: t for t, i in tokenizer.get_vocab().items()}
