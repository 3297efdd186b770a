"""Fill in the middle: a code model writes what goes between a prefix and a suffix (an editor's
completion at the cursor; OpenAI's `suffix`, llama.cpp's /infill, Ollama's `suffix`).

Models trained for it have marker tokens; the prompt is laid out in the order they were
trained on, prefix-suffix-middle (the model then writes the middle) or suffix-prefix
(Codestral's). The markers are read from the vocabulary, so any such model works without
a template; the model's end-of-middle tokens end the answer as its EOS does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from .errors import InvalidArgumentError, shown
from .prompts import check_text


@dataclass(frozen=True)
class FimFormat:
    prefix: int  # the markers' token ids
    suffix: int
    middle: Optional[int]  # None: the middle follows the prefix (suffix first, Codestral's)
    ends: Tuple[int, ...]  # tokens that end a middle besides EOS (present in this vocabulary)
    repo: Optional[int] = None  # the repository-level markers (Qwen2.5-Coder's, StarCoder2's), where it has them
    file_sep: Optional[int] = None

    def context(self, tokenizer, files: List[Tuple[str, str]]) -> List[int]:
        """The ids of other files' (name, text) that go before the prompt, laid out as llama.cpp's
        /infill lays out its `input_extra`: with the repository-level markers, a project, each
        file under its name, then the name of the file being edited; without a file marker, each
        text after a snippet line."""
        ids: List[int] = []
        if self.repo is not None:
            ids += [self.repo, *_text_ids(tokenizer, "myproject\n")]
        for name, text in files:
            if self.file_sep is not None:
                ids += [self.file_sep, *_text_ids(tokenizer, name + "\n")]
            else:
                ids += _text_ids(tokenizer, SNIPPET)
            ids += _text_ids(tokenizer, text)
        if self.file_sep is not None:
            ids += [self.file_sep, *_text_ids(tokenizer, "filename\n")]
        return ids

    def encode(self, tokenizer, prefix: str, suffix: str) -> List[int]:
        """The ids of a fill-in-the-middle prompt (the tokenizer's BOS first where it adds one)."""
        pre = tokenizer.encode(prefix, add_special_tokens=False) if prefix else []
        suf = tokenizer.encode(suffix, add_special_tokens=False) if suffix else []
        if self.middle is None:  # suffix first
            ids = [self.suffix, *suf, self.prefix, *pre]
        else:
            ids = [self.prefix, *pre, self.suffix, *suf, self.middle]
        bos = getattr(tokenizer, "bos_token_id", None)
        adds_bos = bos is not None and tokenizer.encode("a")[:1] == [bos]
        return ([bos] if adds_bos else []) + ids


# (prefix, suffix, middle) markers per family, prefix-suffix-middle unless the middle is None.
STYLES = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2, Granite code
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
    ("[PREFIX]", "[SUFFIX]", None),  # Codestral: [SUFFIX] suffix [PREFIX] prefix
)
# Repository-level markers (a project's name; each file's name and text): Qwen2.5-Coder's, StarCoder2's.
REPO_NAMES = ("<|repo_name|>", "<reponame>")
FILE_SEPS = ("<|file_sep|>", "<file_sep>")
SNIPPET = "\n\n--- snippet ---\n\n"  # between other files' texts where there are no such markers (llama.cpp's)
# Tokens a model writes when the middle is done (besides its EOS), where its vocabulary has them.
ENDS = ("<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|repo_name|>", "<|im_end|>", "<file_sep>",
        "<|end▁of▁sentence|>", "<EOT>", "</s>", "<eos>", "<|file_separator|>")


def fim_format(tokenizer) -> Optional[FimFormat]:
    """This tokenizer's fill-in-the-middle markers, or None when it has none."""
    if tokenizer is None:
        return None
    vocab = tokenizer.get_vocab()
    for style in STYLES:
        if all(name in vocab for name in style if name is not None):
            prefix, suffix, middle = (vocab.get(name) if name is not None else None for name in style)
            markers = {i for i in (prefix, suffix, middle) if i is not None}
            ends = tuple(sorted({vocab[name] for name in ENDS if name in vocab} | markers))
            repo, file_sep = (next((vocab[n] for n in names if n in vocab), None) for names in (REPO_NAMES, FILE_SEPS))
            return FimFormat(prefix, suffix, middle, ends, repo, file_sep)
    return None


def _text_ids(tokenizer, text: str) -> List[int]:
    return tokenizer.encode(text, add_special_tokens=False) if text else []


def check_suffix(suffix, prompt) -> Optional[str]:
    """None (an ordinary prompt) or the text after the insertion point, with a string prompt (the text before it)."""
    if suffix is None:
        return None
    if not isinstance(suffix, str):
        raise InvalidArgumentError(f"suffix must be a string (the text after the insertion point), got {shown(suffix)}")
    if not isinstance(prompt, str):
        chat = isinstance(prompt, (list, tuple)) and any(isinstance(m, dict) for m in prompt)
        kind = "chat" if chat else "token-id" if isinstance(prompt, (list, tuple)) else type(prompt).__name__
        raise InvalidArgumentError(f"suffix needs a string prompt (the text before the insertion point); got a "
                                   f"{kind} prompt")
    return suffix


def no_fim_error() -> InvalidArgumentError:
    names = ", ".join(style[0] for style in STYLES)
    return InvalidArgumentError(f"suffix: this model's vocabulary has no fill-in-the-middle markers (such as {names}), "
                                f"so it was not trained to fill in between a prefix and a suffix; use a code model "
                                f"that was (Qwen2.5-Coder, StarCoder2, DeepSeek-Coder, Codestral), or send no suffix")


def fim_prompt(fmt: Optional[FimFormat], tokenizer, prefix, suffix, vocab_size: int, *,
               chat_only: bool = False) -> List[int]:
    """The ids of a fill-in-the-middle prompt in the model's format `fmt` (None: it has none, refused).
    `chat_only`: the request also asked for what needs chat messages (tools, template variables, a
    continued message), which a prefix and a suffix are not."""
    if chat_only:
        raise InvalidArgumentError("suffix takes a string prompt, and tools, chat_template_kwargs and "
                                   "continue_final_message need chat messages; send one or the other")
    if fmt is None:
        raise no_fim_error()
    ids = fmt.encode(tokenizer, check_text(prefix), check_text(suffix, "suffix"))
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgumentError(f"suffix: the fill-in-the-middle marker id {bad} is outside the model's "
                                   f"vocabulary [0, {vocab_size})")
    return ids
