"""A Hugging Face tokenizer rebuilt from GGUF metadata, wrapped like mlx-lm wraps tokenizers.

Two kinds are built:
- byte-level BPE (`tokenizer.ggml.model == "gpt2"`: SmolLM2, Llama 3, Qwen). The split regex
  before BPE comes from `tokenizer.ggml.pre`, as llama.cpp chooses it (`llama-vocab.cpp`);
  SmolLM2 says "smollm": each digit alone, then GPT-2's regex.
- sentencepiece BPE (`"llama"`: Llama 2, Mistral, TinyLlama): pieces with scores and no merges,
  so the merges are recovered from the scores (`_merges_by_score`), with byte fallback.

Result: `mlx_lm.tokenizer_utils.TokenizerWrapper` around a `PreTrainedTokenizerFast`, with
mlx-lm's streaming detokenizer of that kind, the file's chat template and the ids llama.cpp ends
generation on (`end_ids`).
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx

from ..errors import IncompatibleModelsError

_GPT2 = "gpt2"  # GPT-2's regex, built into ByteLevel(use_regex=True)
_DIGITS_THEN_GPT2 = "digits+gpt2"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN = (  # Mistral Nemo / Small 3: words split at case changes
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_GPT4O = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTION}|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTION}"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's rule for "default" (and for files naming no pre-tokenizer): four splits in turn
_DEFAULT = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)
# tokenizer.ggml.pre -> split rule, with llama.cpp's names for each (`llama-vocab.cpp`).
PRE_TOKENIZERS = {
    "default": _DEFAULT,
    "gpt2": _GPT2, "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2, "jais": _GPT2,
    "exaone4": _GPT2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "codeshell": _DIGITS_THEN_GPT2, "command-r": _DIGITS_THEN_GPT2, "exaone": _DIGITS_THEN_GPT2,
    "minerva-7b": _DIGITS_THEN_GPT2,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3, "pixtral": _LLAMA3,
    "smaug-bpe": _LLAMA3, "dbrx": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "stablelm2": _QWEN2, "megrez": _QWEN2,
    "tekken": _TEKKEN,
    "gpt-4o": _GPT4O, "llama4": _GPT4O,
}
# Families llama.cpp reads with `ignore_merges` (a pre-token that is a token is taken whole) and
# starts with BOS unless the file says otherwise.
_WHOLE_WORDS_AND_BOS = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"}
NORMAL, CONTROL, USER_DEFINED = 1, 3, 4  # llama.cpp token types
# Tokens llama.cpp ends generation on by their text (`llama-vocab.cpp`), beside the file's eos /
# eot / eom ids: converters often write only EOS, the end of a document, while a chat turn ends
# with another token (Gemma's <end_of_turn>, Phi-3's <|end|>, Qwen's <|im_end|> in base models).
END_NAMES = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>",
             "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
             "<\uff5cend\u2581of\u2581sentence\uff5c>")  # DeepSeek's, in full-width bars
# gpt-oss's harmony ends an answer with <|return|>, or <|call|> before a tool runs; with both in the
# vocabulary llama.cpp takes <|end|> off its end tokens
HARMONY_ENDS = ("<|return|>", "<|call|>")
# ... and its fill-in-the-middle pad, repository and file-separator tokens: by key, else by text
FIM_ENDS = {
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}


def _value(metadata, key, default=None):
    v = metadata.get(key, default)
    return v.item() if isinstance(v, mx.array) and v.ndim == 0 else v


def tokenizer_from_gguf(metadata: dict):
    """Build the tokenizer a GGUF file describes.

    Args:
        metadata: the metadata dict from `mx.load(path, return_metadata=True)`.

    Returns:
        `mlx_lm.tokenizer_utils.TokenizerWrapper`.

    Raises:
        IncompatibleModelsError: the vocabulary is neither byte-level BPE nor sentencepiece
            BPE, or its pre-tokenizer is unknown (the message lists the known ones).
    """
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    kind = _value(metadata, "tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise IncompatibleModelsError(
            f"GGUF tokenizer model {kind!r} is not supported; supported: byte-level BPE ('gpt2', as in "
            "SmolLM2, Llama 3 and Qwen files) and sentencepiece BPE ('llama', as in Llama 2, Mistral "
            "and TinyLlama files)"
        )
    if metadata.get("tokenizer.ggml.tokens") is None:
        raise IncompatibleModelsError("the GGUF has no vocabulary (tokenizer.ggml.tokens)")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    types = metadata.get("tokenizer.ggml.token_type")
    types = types.tolist() if types is not None else [NORMAL] * len(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)

    def token(key):
        i = _value(metadata, f"tokenizer.ggml.{key}")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    if kind == "gpt2":
        tok = _byte_level_bpe(metadata, vocab)
        detokenizer = BPEStreamingDetokenizer
    else:
        prefix = bool(_value(metadata, "tokenizer.ggml.add_space_prefix", True))
        tok = _sentencepiece_bpe(metadata, tokens, types, vocab, token("unknown_token_id"), prefix)
        # without a space prefix (Gemma) a text's own leading space is real: mlx-lm's rule too
        detokenizer = SPMStreamingDetokenizer if prefix else partial(SPMStreamingDetokenizer, trim_space=False)
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == USER_DEFINED]
    )

    bos = token("bos_token_id")
    # llama.cpp starts a sentencepiece vocabulary's text with BOS unless the file says otherwise,
    # and a Llama 3 or Tekken one
    bos_first = kind == "llama" or _value(metadata, "tokenizer.ggml.pre") in _WHOLE_WORDS_AND_BOS
    if bool(_value(metadata, "tokenizer.ggml.add_bos_token", bos_first)) and bos is not None:
        bos_id = vocab[bos]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=token("eos_token_id"),
        unk_token=token("unknown_token_id"), pad_token=token("padding_token_id"),
    )
    template = _value(metadata, "tokenizer.chat_template")
    if template:
        fast.chat_template = template
    return TokenizerWrapper(fast, detokenizer, eos_token_ids=end_ids(metadata, tokens, vocab))


def end_ids(metadata: dict, tokens: list, vocab: dict) -> list[int]:
    """The ids generation ends on, as llama.cpp chooses them: the file's eos / eot / eom ids
    (EOS first), END_NAMES in the vocabulary, and the FIM_ENDS tokens (harmony's: HARMONY_ENDS).

    Raises:
        IncompatibleModelsError: an id the file names is outside the vocabulary.
    """
    said = (_value(metadata, f"tokenizer.ggml.{k}") for k in ("eos_token_id", "eot_token_id", "eom_token_id"))
    named = [int(i) for i in said if i is not None]
    if bad := [i for i in named if not 0 <= i < len(tokens)]:  # generation would never stop on it
        raise IncompatibleModelsError(f"the GGUF's end-of-text token id {bad[0]} is outside its vocabulary of "
                                      f"{len(tokens)} tokens")
    found = [vocab[t] for t in END_NAMES if t in vocab]
    for key, names in FIM_ENDS.items():
        said = _value(metadata, f"tokenizer.ggml.{key}_token_id")
        if said is not None:
            found += [int(said)] if 0 <= int(said) < len(tokens) else []
        else:
            found += [vocab[t] for t in names if t in vocab][:1]
    if all(t in vocab for t in HARMONY_ENDS):  # gpt-oss: <|end|> closes a message (its analysis), not the answer
        found += [vocab[t] for t in HARMONY_ENDS]
        named, found = ([i for i in ids if i != vocab.get("<|end|>")] for ids in (named, found))
    return list(dict.fromkeys(named + sorted(found)))


def _byte_level_bpe(metadata, vocab):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = _value(metadata, "tokenizer.ggml.pre", "default") or "default"
    if pre not in PRE_TOKENIZERS:
        raise IncompatibleModelsError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {sorted(PRE_TOKENIZERS)}"
        )
    if not metadata.get("tokenizer.ggml.merges"):  # BPE without merges: one token per byte, garbage
        raise IncompatibleModelsError("the GGUF's byte-level BPE vocabulary has no merges (tokenizer.ggml.merges)")
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    try:
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False,
                                   ignore_merges=pre in _WHOLE_WORDS_AND_BOS))
    except Exception as e:  # the tokenizers library raises a bare Exception for a merge of unknown tokens
        raise IncompatibleModelsError(f"the GGUF's BPE vocabulary and merges do not fit together ({e})") from None
    tok.pre_tokenizer = _pre_tokenizer(PRE_TOKENIZERS[pre], pre_tokenizers, Regex)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(metadata, tokens, types, vocab, unk, prefix: bool):
    """Sentencepiece's BPE as llama.cpp runs it: spaces are "\u2581" (one before the text when
    `prefix`, the file's `add_space_prefix`, true by default), then adjacent pieces merge,
    highest-scored result first, and what no piece covers falls back to <0xXX> byte tokens."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    scores = metadata.get("tokenizer.ggml.scores")
    if scores is None:
        raise IncompatibleModelsError("the GGUF's sentencepiece vocabulary has no scores (tokenizer.ggml.scores)")
    scores = scores.tolist()
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_merges_by_score(tokens, types, scores, vocab), unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Prepend("\u2581")] if prefix else []
    tok.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "\u2581")])
    undo = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence(undo + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tok


def _merges_by_score(tokens, types, scores, vocab) -> list[tuple[str, str]]:
    """Every way to join two normal pieces into a third, the third's score deciding the order:
    BPE applying them by rank merges as sentencepiece does, best-scored first."""
    merges = []
    for piece, kind, score in zip(tokens, types, scores):
        if kind != NORMAL or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-score, vocab[left], vocab[right], left, right))
    merges.sort()
    return [(left, right) for *_, left, right in merges]


def _pre_tokenizer(rule, pre_tokenizers, Regex):
    if rule == _GPT2:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if rule == _DIGITS_THEN_GPT2:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
    rules = rule if isinstance(rule, tuple) else (rule,)
    return pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in rules]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
