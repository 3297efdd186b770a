"""llama.cpp's draft/target vocabulary rule (mlxspec.compat)."""

from __future__ import annotations

import pytest

from mlxspec.compat import VOCAB_SLACK, check_logit_widths, check_tokenizers
from mlxspec.errors import IncompatibleModelsError


def make(tokens, *, eos="</s>", bos=None, kind="BPE"):
    """A real Hugging Face fast tokenizer over `tokens` (ids in list order), wrapped like mlx-lm."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=[]) if kind == "BPE" else models.WordLevel(vocab=vocab, unk_token=tokens[0])
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(model), eos_token=eos, bos_token=bos)
    return TokenizerWrapper(fast)


BASE = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(300)]


def test_same_vocabulary_is_compatible():
    check_tokenizers(make(BASE), make(list(BASE)))


def test_mlx_lm_tiny_tokenizer_is_compatible_with_itself():
    from tiny import make_tokenizer

    check_tokenizers(make_tokenizer(), make_tokenizer())


def test_extra_tokens_within_slack_are_compatible():
    check_tokenizers(make(BASE + [f"x{i}" for i in range(VOCAB_SLACK)]), make(BASE))


def test_vocab_size_beyond_slack_is_refused():
    with pytest.raises(IncompatibleModelsError, match=f"differ by {VOCAB_SLACK + 1}"):
        check_tokenizers(make(BASE + [f"x{i}" for i in range(VOCAB_SLACK + 1)]), make(BASE))


def test_differing_token_text_names_the_first_id_and_both_texts():
    other = list(BASE)
    other[57], other[99] = "zz", "yy"
    with pytest.raises(IncompatibleModelsError, match=r"token 57 differs: target 't54', draft 'zz'"):
        check_tokenizers(make(BASE), make(other))


def test_different_eos_is_refused():
    with pytest.raises(IncompatibleModelsError, match=r"eos_token_id differs: target 2, draft 1"):
        check_tokenizers(make(BASE, eos="</s>"), make(BASE, eos="<s>"))


def test_different_bos_is_refused():
    with pytest.raises(IncompatibleModelsError, match="bos_token_id differs"):
        check_tokenizers(make(BASE, bos="<s>"), make(BASE, bos=None))


def test_different_tokenizer_kind_is_refused():
    with pytest.raises(IncompatibleModelsError, match="kinds differ: target BPE, draft WordLevel"):
        check_tokenizers(make(BASE), make(BASE, kind="WordLevel"))


def test_logit_widths():
    check_logit_widths(49152, 49152)
    with pytest.raises(IncompatibleModelsError, match="152064, draft 151936"):
        check_logit_widths(152064, 151936)
