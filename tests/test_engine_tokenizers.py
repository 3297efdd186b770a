"""What the engine takes (tokenizers, prompts, keywords), beside how mlx-lm's generate takes them."""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np
import pytest

import tiny
from mlxspec import Engine
from mlxspec.errors import InvalidArgumentError

PROMPT = [5, 6, 7, 8, 9, 10, 5, 6, 7, 11, 12]


@pytest.fixture(scope="module")
def target():
    return tiny.make_llama(1)


def test_a_hugging_face_tokenizer_is_wrapped_as_mlx_lm_wraps_it(target):
    wrapped = tiny.make_tokenizer()
    plain = wrapped._tokenizer  # transformers' PreTrainedTokenizerFast, with no EOS ids set of its own
    messages = [{"role": "user", "content": "Say something."}]
    want = Engine(target, wrapped).generate(messages, max_tokens=12)
    got = Engine(target, plain).generate(messages, max_tokens=12)
    assert got.tokens == want.tokens and got.text == want.text and got.finish_reason == want.finish_reason


def test_chat_messages_without_a_chat_template_say_what_to_send(target):
    tok = copy.deepcopy(tiny.make_tokenizer()._tokenizer)
    tok.chat_template = None
    engine = Engine(target, tok)
    with pytest.raises(InvalidArgumentError, match="no chat template.*string prompt"):
        engine.generate([{"role": "user", "content": "hi"}], max_tokens=2)
    assert len(engine.generate("hi", max_tokens=2).tokens) == 2  # a string is the text itself


def test_a_chat_template_that_refuses_the_messages_is_said(target):
    tok = copy.deepcopy(tiny.make_tokenizer()._tokenizer)
    tok.chat_template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('roles must alternate') }}{% endif %}x"
    engine = Engine(target, tok)
    with pytest.raises(InvalidArgumentError, match="chat template failed on these messages.*roles must alternate"):
        engine.generate([{"role": "assistant", "content": "hi"}], max_tokens=2)
    tok.chat_template = "{% if %}"  # broken
    with pytest.raises(InvalidArgumentError, match="chat template failed.*TemplateSyntaxError"):
        Engine(target, tok).generate([{"role": "user", "content": "hi"}], max_tokens=2)


GEMMA2_TEMPLATE = (  # Gemma 2's own, which refuses a system message
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


def test_a_system_message_a_template_refuses_goes_before_the_first_user_message(target):
    from mlxspec.prompts import render_chat

    tok = copy.deepcopy(tiny.make_tokenizer()._tokenizer)
    tok.chat_template = GEMMA2_TEMPLATE
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    text = render_chat(msgs, tok)
    assert text == render_chat([{"role": "user", "content": "Be brief.\n\nhi"}, *msgs[2:]], tok)
    assert "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>" in text and "system" not in text
    assert len(Engine(target, tok).generate(msgs, max_tokens=2).tokens) == 2
    # a template that refuses the folded messages too: its first refusal is told
    with pytest.raises(InvalidArgumentError, match="System role not supported"):
        render_chat([msgs[0], msgs[2]], tok)


@pytest.mark.parametrize("make", [mx.array, np.array], ids=["mx", "numpy"])
def test_a_1d_integer_array_is_a_token_id_prompt(target, make):
    engine = Engine(target, tiny.make_tokenizer())
    want = engine.generate(PROMPT, max_tokens=6).tokens
    assert engine.generate(make(PROMPT), max_tokens=6).tokens == want
    assert len(engine.generate(PROMPT, max_tokens=make(6)).tokens) == 6  # an integer scalar, too
    with pytest.raises(InvalidArgumentError, match="token ids must be integers|prompt must be"):
        engine.generate(make([[5, 6]]), max_tokens=2)  # 2-D: not a prompt
    with pytest.raises(InvalidArgumentError, match="token ids must be integers"):
        engine.generate(make([5.7, 6.2]), max_tokens=2)  # not truncated to 5, 6


def test_mlx_lm_keywords_are_refused_with_mlxspec_s_way(target):
    engine = Engine(target, tiny.make_tokenizer())
    with pytest.raises(InvalidArgumentError, match=r"unknown option 'temp' \(mlx-lm's; here: temperature=\); "
                                                   r"allowed: max_tokens, temperature"):
        engine.generate(PROMPT, temp=0.5)
    with pytest.raises(InvalidArgumentError, match=r"unknown options 'sampler' .*'colour'"):
        engine.stream(PROMPT, sampler=None, colour=1)  # refused when called, before any work
    assert len(engine.generate(PROMPT, max_tokens=3).tokens) == 3


@pytest.mark.parametrize("given,says", [
    ({"max_new_tokens": 3}, r"'max_new_tokens' \(Hugging Face's; here: max_tokens=\)"),
    ({"stop_sequences": ["x"]}, r"'stop_sequences' \(Anthropic's; here: stop=\)"),
    ({"max_token": 3}, r"'max_token' \(did you mean max_tokens=\?\)"),
    ({"temprature": 0.5}, r"'temprature' \(did you mean temperature=\?\)"),
    ({"colour": 1}, r"unknown option 'colour'; allowed"),  # nothing close: just the list
])
def test_other_libraries_names_and_typos_are_refused_with_the_name_here(target, given, says):
    with pytest.raises(InvalidArgumentError, match=says):
        Engine(target, tiny.make_tokenizer()).generate(PROMPT, **given)
