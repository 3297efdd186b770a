"""Predicted Outputs (OpenAI's `prediction`): text the answer is expected to largely repeat (a
file being edited, a document being corrected). The n-gram drafter drafts from it where the
answer's tail matches it (`NgramDrafter.predict`); the target verifies every draft, so the
answer stays the target's own. Here: the prediction checked, and OpenAI's usage counts of it.
"""

from __future__ import annotations

import difflib
from typing import List, Optional, Tuple

from .errors import InvalidArgumentError, shown
from .prompts import check_text

MAX_PREDICTION = 1 << 16  # tokens: its n-gram index lives for the request


def check_prediction(prediction, tokenizer, vocab_size: int) -> Optional[List[int]]:
    """None, or the prediction's token ids: a string (encoded as the answer's text is, without
    special tokens) or a list of token ids in the vocabulary."""
    if prediction is None:
        return None
    if isinstance(prediction, str) and tokenizer is None:
        raise InvalidArgumentError("a prediction as text needs the model's tokenizer, and this engine has none: "
                                   "give its token ids")
    if isinstance(prediction, str):
        ids = tokenizer.encode(check_text(prediction, "prediction"), add_special_tokens=False)
    elif isinstance(prediction, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool)
                                                       and 0 <= t < vocab_size for t in prediction):
        ids = list(prediction)
    else:
        raise InvalidArgumentError(f"prediction must be the text the answer is expected to repeat (a string) or "
                                   f"its token ids (integers in [0, {vocab_size})), got {shown(prediction)}")
    if len(ids) > MAX_PREDICTION:
        raise InvalidArgumentError(f"prediction is {len(ids)} tokens; at most {MAX_PREDICTION} are taken")
    return ids or None


def prediction_counts(prediction: List[int], answer: List[int]) -> Tuple[int, int]:
    """OpenAI's (accepted_prediction_tokens, rejected_prediction_tokens): the prediction's tokens
    that appear in the answer, in order (a diff's matching blocks), and the rest of them."""
    blocks = difflib.SequenceMatcher(None, prediction, answer, autojunk=False).get_matching_blocks()
    accepted = sum(b.size for b in blocks)
    return accepted, len(prediction) - accepted
