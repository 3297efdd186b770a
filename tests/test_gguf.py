"""The GGUF loader against an independent NumPy reference (gguf's reader and dequantizer)."""

from __future__ import annotations

import argparse
import re

import numpy as np
import pytest

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from tiny import float32_tol
from mlxspec.errors import IncompatibleModelsError, MlxSpecError
from mlxspec.loading import gguf as gguf_loader
from mlxspec.loading import gguf_arch
from mlxspec.loading import load_model
from mlxspec.loading.gguf_header import read_tensor_table

from gguf_reference import check_logits, reference_logits, reference_weights
from tiny_gguf import write_tiny_gguf

TEXTS = [
    "def hello(name):\n    return f'hello {name}'\n",
    "Ünïcödé, 日本語, naïve café",
    "emoji 🤖🎉 and a flag 🇫🇷",
    "  leading spaces,\ttabs\t\tand\n\n\nnewlines   ",
    "Numbers 12345 and 2024-01-01.",
    "",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    trained = write_tiny_gguf(path)
    return path, trained


def test_tensor_table_matches_gguf_reader(tiny):
    import gguf

    path, _ = tiny
    ours = {t.name: (t.type_name, t.shape) for t in read_tensor_table(path)}
    theirs = {t.name: (t.tensor_type.name, tuple(int(d) for d in t.shape)) for t in gguf.GGUFReader(str(path)).tensors}
    assert ours == theirs
    assert {"Q8_0", "Q4_0", "Q4_1", "F16", "F32"} <= {t for t, _ in ours.values()}


def test_dequantized_tensors_match_gguf_dequantize(tiny):
    path, _ = tiny
    tensors, _, types = gguf_loader.read_gguf(path)
    ref = reference_weights(path)
    for name, kind in types.items():
        base = name.removesuffix(".weight")
        if kind.startswith("Q"):
            w = tensors[name]
            # float32 scales/biases: the stored values exactly, without float16 rounding of the product
            scales, biases = tensors[base + ".scales"].astype(mx.float32), tensors[base + ".biases"].astype(mx.float32)
            bits = w.shape[-1] // scales.shape[-1]
            assert bits == (8 if kind == "Q8_0" else 4), name
            got = mx.dequantize(w, scales, biases, group_size=32, bits=bits)
        else:
            got = tensors[name]
        np.testing.assert_allclose(np.array(got.astype(mx.float32)), ref[name], rtol=1e-6, atol=1e-6, err_msg=name)


def test_layers_stay_quantized_with_their_own_bits(tiny):
    model, _, info = load_model(tiny[0], dtype="quantized")
    layer = model.model.layers[0]
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding) and model.model.embed_tokens.bits == 8
    assert isinstance(layer.self_attn.q_proj, nn.QuantizedLinear) and layer.self_attn.q_proj.bits == 4
    assert layer.self_attn.o_proj.bits == 8
    assert isinstance(layer.self_attn.v_proj, nn.Linear) and layer.self_attn.v_proj.weight.dtype == mx.float16
    assert info.quantization.startswith("GGUF ") and "token_embd Q8_0" in info.quantization
    assert info.format == "gguf" and info.vocab_size == 330 and info.weights_bytes > 0


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_logits_match_numpy_reference(tiny, dtype, tol):
    tol = tol or float32_tol()
    path, trained = tiny
    ids = trained.encode("def hello(name): 12345 🤖").ids
    model, _, _ = load_model(path, dtype=dtype)
    check_logits(model, path, ids, tol)


@pytest.mark.parametrize("arch, head_dim", [("qwen2", None), ("qwen3", 24), ("phi3", None)])
@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_qwen_and_phi3_logits_match_numpy_reference(tmp_path, arch, head_dim, dtype, tol):
    # qwen2: Q/K/V biases; qwen3: per-head Q/K norms and a head dim other than hidden / heads;
    # phi3: Q, K, V in one matrix, gate and up in another, a sentencepiece vocabulary. All keep
    # HF's rows and rotate halves (the reference agrees with llama.cpp's to 3-4e-4 on float32
    # files of each, as it does for llama: the loader's README).
    tol = tol or float32_tol()
    path = tmp_path / f"{arch}.gguf"
    trained = write_tiny_gguf(path, arch=arch, pre="spm" if arch == "phi3" else "qwen2", head_dim=head_dim,
                              tied=False, seed=7)
    model, _, _ = load_model(path, dtype=dtype)
    assert type(model).__module__ == f"mlx_lm.models.{arch}"
    text = "def hello(name): 12345 🤖"
    ids = [trained.bos_id()] + trained.encode(text) if arch == "phi3" else trained.encode(text).ids
    check_logits(model, path, ids, tol)


@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_gemma3_logits_match_numpy_reference(tmp_path, dtype, tol):
    # Gemma 3: norms stored as 1 + w each side of attention and the MLP, per-head Q/K norms, GELU,
    # a scaled input, a sliding window of 4 on 5 layers in 6 with their own RoPE base, a head dim
    # other than hidden / heads, a tied output, Gemma's sentencepiece vocabulary without a space
    # prefix. The reference agrees with llama.cpp's forward to 8e-5 on a float32 file like this.
    tol = tol or float32_tol()
    path = tmp_path / "gemma3.gguf"
    sp = write_tiny_gguf(path, arch="gemma3", pre="spm-no-prefix", layers=7, window=4, head_dim=24, seed=11)
    model, tok, _ = load_model(path, dtype=dtype)
    assert type(model).__module__ == "mlx_lm.models.gemma3_text" and model.tie_word_embeddings
    text = "def hello(name): 12345 and more words, past the window"
    ids = tok.encode(text)
    assert ids == [sp.bos_id()] + sp.encode(text) and len(ids) > 3 * 4
    check_logits(model, path, ids, tol)


def test_gemma3_speculation_stays_lossless_across_the_window(tmp_path):
    from mlxspec import Engine

    path = tmp_path / "gemma3.gguf"
    write_tiny_gguf(path, arch="gemma3", pre="spm-no-prefix", layers=6, window=4, seed=12)
    model, tok, _ = load_model(path, dtype="float32")
    plain = Engine(model, tok, None, drafter="none").generate("hello hello hello world", max_tokens=32)
    spec = Engine(model, tok, None, drafter="ngram", num_draft=3).generate("hello hello hello world", max_tokens=32)
    assert spec.tokens == plain.tokens and len(plain.tokens) == 32 and spec.stats.drafted > 0


@pytest.mark.parametrize("arch", ["smollm3", "granite", "olmo2"])
# kept quantized, activations are float16 (the Q8_0 embedding's scales): 8 float16 steps of room,
# as OLMo 2's residual stream, normed only inside each block, grows widest
@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 8 * 2.0**-11)])
def test_llama_variants_match_numpy_reference(tmp_path, arch, dtype, tol):
    # llama's rows and RoPE, and: SmolLM3 no RoPE in every 4th layer; Granite four scales (of the
    # embeddings, of what each block adds, of attention scores, of the logits), none at its
    # default here. OLMo 2: HF's rows and RoPE, norms after attention and the MLP only, Q and K
    # normed whole. Against llama.cpp on float32 files like these: SmolLM3 2.6e-4 of the largest
    # logit, Granite 2.9e-5, OLMo 2 4.6e-4, the reference alike.
    tol = tol or float32_tol()
    path = tmp_path / f"{arch}.gguf"
    trained = write_tiny_gguf(path, arch=arch, pre="llama-bpe", layers=5, seed=8)
    model, _, _ = load_model(path, dtype=dtype)
    assert type(model).__module__ == f"mlx_lm.models.{arch}"
    if arch == "smollm3":
        assert model.args.no_rope_layers == [1, 1, 1, 0, 1]
    ids = trained.encode("def hello(name): 12345 and more words").ids
    check_logits(model, path, ids, tol)


@pytest.mark.parametrize("rope_dims, longrope", [(12, True), (16, True), (8, False)],
                         ids=["phi4-mini", "phi3.5", "partial"])
@pytest.mark.parametrize("dtype, tol", [("float32", None), ("quantized", 2e-3)])
def test_phi3_longrope_and_partial_rotary_match_numpy_reference(tmp_path, rope_dims, longrope, dtype, tol):
    # Phi-3.5 and the 128k Phi-3: LongRoPE, run as mlx-lm runs them (the long factors, its
    # attention factor on the rotated dims); Phi-4-mini also rotates 3/4 of each head. Past the
    # original context of 32 here, where llama.cpp takes the long factors too (against it on
    # float32 files like these, 64 tokens: 2.1e-4-2.3e-4 of the largest logit, the reference alike).
    tol = tol or float32_tol()
    path = tmp_path / "phi3.gguf"
    trained = write_tiny_gguf(path, arch="phi3", pre="spm", rope_dims=rope_dims, longrope=longrope, seed=7)
    model, _, _ = load_model(path, dtype=dtype)
    rope = model.model.layers[0].self_attn.rope
    assert type(rope).__name__ == ("SuScaledRoPE" if longrope else "RoPE") and model.args.partial_rotary_factor == (
        rope_dims / 16)
    ids = [trained.bos_id()] + trained.encode("def hello(name): 12345 and more words, " * 3)
    assert len(ids) > 32
    check_logits(model, path, ids, tol)


def test_phi3_longrope_it_cannot_run_as_the_file_says_is_refused(tmp_path):
    path = tmp_path / "phi3-128k.gguf"
    factors = np.linspace(1.0, 2.0, 5).astype(np.float32).view(np.uint8)  # 5 values for 8 rotated pairs
    write_tiny_gguf(path, arch="phi3", pre="spm", extra={"rope_factors_long.weight": (factors, "F32")})
    with pytest.raises(IncompatibleModelsError, match=r"LongRoPE factors have 5 and 5 values; 8 .* are needed"):
        load_model(path)
    write_tiny_gguf(path, arch="phi3", pre="spm", longrope=1.5)  # a factor of its own
    with pytest.raises(IncompatibleModelsError, match=r"attention factor 1.5 is not the 1.2\d* mlx-lm derives"):
        load_model(path)


def test_reference_tells_qwen_from_llama_rows(tmp_path, monkeypatch):
    # The qwen test can fail: un-permuting qwen's rows as llama's breaks the match.
    path = tmp_path / "qwen2.gguf"
    trained = write_tiny_gguf(path, arch="qwen2", pre="qwen2")
    real = gguf_loader._unpermute_qk
    monkeypatch.setattr(gguf_loader, "_unpermute_qk", lambda weights, args: None)
    monkeypatch.setattr(gguf_loader, "load_gguf_model", _always_unpermuting(gguf_loader.load_gguf_model, real))
    ids = trained.encode("def hello(name): 12345").ids
    model, _, _ = load_model(path, dtype="float32")
    got = np.array(model(mx.array([ids])))[0]
    ref = reference_logits(path, ids)
    assert np.abs(got - ref).max() > 1e-2 * np.abs(ref).max()


def _always_unpermuting(load, unpermute):
    def wrapped(path, float_dtype=None):
        model, metadata, types = load(path, float_dtype)
        weights = dict(tree_flatten(model.parameters()))
        unpermute(weights, argparse.Namespace(head_dim=model.args.hidden_size // model.args.num_attention_heads,
                                              num_hidden_layers=model.args.num_hidden_layers,
                                              num_attention_heads=model.args.num_attention_heads,
                                              num_key_value_heads=model.args.num_key_value_heads))
        model.load_weights(list(weights.items()))
        return model, metadata, types
    return wrapped


def test_reference_detects_a_missing_qk_unpermute(tiny, monkeypatch):
    # The logits test can fail: skipping the Q/K row un-permutation breaks the match.
    path, trained = tiny
    monkeypatch.setattr(gguf_loader, "_unpermute_qk", lambda weights, args: None)
    ids = trained.encode("def hello(name): 12345").ids
    model, _, _ = load_model(path, dtype="float32")
    got = np.array(model(mx.array([ids])))[0]
    ref = reference_logits(path, ids)
    assert np.abs(got - ref).max() > 1e-2 * np.abs(ref).max()


def test_untied_head_and_llama3_rope_freqs(tmp_path):
    path = tmp_path / "untied.gguf"
    trained = write_tiny_gguf(path, tied=False, types={"token_embd": "Q4_1", "ffn_down": "Q8_0"}, seed=3,
                              rope_freqs=True)
    model, _, _ = load_model(path, dtype="float32")
    assert not model.args.tie_word_embeddings
    assert isinstance(model.model.layers[0].self_attn.rope, gguf_loader.FreqsRoPE)
    ids = trained.encode("hello world").ids
    ref = reference_logits(path, ids)
    got = np.array(model(mx.array([ids])))[0]
    assert np.abs(got - ref).max() <= float32_tol() * np.abs(ref).max()


@pytest.mark.parametrize("pre", ["gpt-2", "smollm"])
def test_tokenizer_matches_the_trained_tokenizer_and_round_trips(tmp_path, pre):
    path = tmp_path / f"{pre}.gguf"
    trained = write_tiny_gguf(path, pre=pre)
    _, tok, _ = load_model(path, dtype="quantized")
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == trained.encode(text).ids, text
        assert tok.decode(ids) == text
        detok = tok.detokenizer
        detok.reset()
        for i in ids:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == (text[1:] if text.startswith(" ") else text)  # mlx-lm drops one leading space
    if pre == "smollm":
        assert len(tok.encode("12345", add_special_tokens=False)) == 5  # each digit alone


@pytest.mark.parametrize("pre, text, pieces", [
    # llama.cpp's "default" (also files naming none): punctuation runs, GPT-2's words, digit runs,
    # then threes; not GPT-2's rule alone
    ("default", "Numbers 12345 and 2024-01-01. a+b",
     ["Numbers", "Ġ", "123", "45", "Ġand", "Ġ", "202", "4", "-", "01", "-", "01", ".", "Ġa", "+", "b"]),
    # Mistral's Tekken: words split where the case changes, digits one by one
    ("tekken", "CamelCaseWord HTTPServer 123", ["Camel", "Case", "Word", "ĠHTTPServer", "Ġ", "1", "2", "3"]),
    ("llama-bpe", "I'm 12345", ["I", "'m", "Ġ", "123", "45"]),
])
def test_pre_tokenizer_splits_as_llama_cpp(tmp_path, pre, text, pieces):
    # The rules of all 28 names in PRE_TOKENIZERS gave llama.cpp's tokens on 19 texts (the
    # loader's README); these pin three of them here.
    from mlxspec.loading.gguf_header import read_header
    from mlxspec.loading.gguf_tokenizer import tokenizer_from_gguf

    path = tmp_path / f"{pre}.gguf"
    write_tiny_gguf(path, pre=pre)
    metadata, _ = read_header(path)
    tok = tokenizer_from_gguf(metadata)
    assert [p for p, _ in tok._tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)] == pieces
    del metadata["tokenizer.ggml.add_bos_token"]  # no flag: llama.cpp starts Llama 3 and Tekken text with BOS
    starts = tokenizer_from_gguf(metadata).encode("hi")[0] == tok.bos_token_id
    assert starts == (pre in ("tekken", "llama-bpe"))


def test_tokenizer_special_tokens_and_chat_template(tiny):
    _, tok, _ = load_model(tiny[0], dtype="quantized")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.encode("<|im_start|>user<|im_end|>", add_special_tokens=False)[-1] == im_end
    assert tok.eos_token_id == im_end and im_end in tok.eos_token_ids
    assert tok.bos_token_id == tok.convert_tokens_to_ids("<|im_start|>")
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)) == text


def _ends(tokens, **ids):
    from mlxspec.loading.gguf_tokenizer import end_ids

    metadata = {f"tokenizer.ggml.{k}": mx.array(v) for k, v in ids.items()}
    return end_ids(metadata, tokens, {t: i for i, t in enumerate(tokens)})


def test_generation_ends_where_llama_cpp_ends_it():
    # Converters often name only EOS; a chat turn ends on another token, which llama.cpp finds by
    # its text (checked against llama.cpp's own set on 39 files, the demo's among them: ids 0, 2, 4).
    gemma = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "a"]
    assert _ends(gemma, eos_token_id=1) == [1, 5]
    phi3 = ["<unk>", "<s>", "</s>", "a", "<|assistant|>", "<|end|>", "<|endoftext|>"]
    assert _ends(phi3, eos_token_id=6) == [6, 2, 5]
    smollm = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<reponame>", "<file_sep>"]
    assert _ends(smollm, eos_token_id=2) == [2, 0, 4]  # llama.cpp's FIM repository token too
    qwen = ["a", "<|endoftext|>", "<|im_end|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "b"]
    assert _ends(qwen, eos_token_id=2, eot_token_id=2) == [2, 1, 3, 4, 5]
    assert _ends(qwen, eos_token_id=2, fim_pad_token_id=6) == [2, 1, 4, 5, 6]  # the file's key over the text
    assert _ends(["a", "b"], eos_token_id=1) == [1]


@pytest.fixture(scope="module", params=["spm", "spm-no-prefix"])
def spm_file(tmp_path_factory, request):
    path = tmp_path_factory.mktemp("spm") / "spm.gguf"
    sp = write_tiny_gguf(path, pre=request.param)
    return path, sp


SPM_TEXTS = TEXTS + [" ", "a  b   c    d", "zzz qqq XYZ ñ", "The quick brown fox jumps over the lazy dog."]


def test_sentencepiece_vocabulary_tokenizes_as_sentencepiece(spm_file):
    # Llama 2 / Mistral / TinyLlama files: pieces and scores, no merges. These texts also
    # tokenized identically with llama.cpp's tokenizer on this file (the loader's README).
    path, sp = spm_file
    _, tok, _ = load_model(path, dtype="float32")
    bos = sp.bos_id()
    for text in SPM_TEXTS:
        ids = tok.encode(text)
        assert ids == [bos] + sp.encode(text), text
        assert tok.decode(ids, skip_special_tokens=True) == text
    assert any(sp.id_to_piece(i).startswith("<0x") for i in sp.encode("日本語 🤖"))  # byte fallback exercised
    chat = tok.apply_chat_template([{"role": "user", "content": "hi there"}], add_generation_prompt=True)
    start, end = (tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>"))
    assert chat[0] == start and end in chat and tok.eos_token_id == sp.eos_id()  # the template writes no BOS


def test_sentencepiece_streaming_text_is_the_decoded_text(spm_file):
    from mlxspec import Engine

    path, _ = spm_file
    model, tok, _ = load_model(path, dtype="float32")
    engine = Engine(model, tok, None, drafter="ngram")
    events = list(engine.stream("日本語 and 🤖 hello", max_tokens=40, temperature=1.0, seed=3))
    ids = [t for ev in events for t in ([ev.token] if isinstance(ev.token, int) else ev.token or [])]
    assert len(ids) >= 10
    assert "".join(ev.text for ev in events) == tok.decode(ids)
    detokenizer = tok.detokenizer  # mlx-lm's own streaming, as its generate (the bench's peer) runs it
    detokenizer.reset()
    for t in ids:
        detokenizer.add_token(t)
    detokenizer.finalize()
    assert detokenizer.text == tok.decode(ids)


def test_sentencepiece_files_without_a_bos_flag_start_with_bos(spm_file):
    # llama.cpp's default for sentencepiece vocabularies; older Llama 2 files carry no flag
    from mlxspec.loading.gguf_header import read_header
    from mlxspec.loading.gguf_tokenizer import tokenizer_from_gguf

    path, sp = spm_file
    metadata, _ = read_header(path)
    del metadata["tokenizer.ggml.add_bos_token"]
    assert tokenizer_from_gguf(metadata).encode("hello") == [sp.bos_id()] + sp.encode("hello")


def test_unsupported_tensor_type_is_named(tmp_path):
    import gguf

    raw = np.zeros((4, gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_K][1]), dtype=np.uint8)
    path = tmp_path / "k.gguf"
    write_tiny_gguf(path, extra={"blk.0.extra.weight": (raw, "Q8_K")})
    with pytest.raises(MlxSpecError, match=r"Q8_K.*blk\.0\.extra\.weight.*supported types.*Q4_K"):
        load_model(path)


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(IncompatibleModelsError, match="'gpt2' is not supported"):
        load_model(path)


def test_truncated_gguf_names_the_file(tiny, tmp_path):
    data = tiny[0].read_bytes()
    for cut in (len(data) // 2, 200):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(data[:cut])
        with pytest.raises(MlxSpecError, match=str(bad)):
            load_model(bad)


def test_a_cut_header_is_said_in_the_file_s_terms(tiny, tmp_path):
    data = tiny[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:20])  # within the counts after the magic: version, tensors, keys (20 bytes from byte 4)
    with pytest.raises(MlxSpecError, match=r"not a readable GGUF file \(truncated or corrupt header: 20 bytes read at "
                                           r"byte 4 run past the end of the file \(20 bytes\)\); download it again") as e:
        load_model(cut)
    assert "unpack_from" not in str(e.value)  # the struct module's words stay out of it
    garbled = tmp_path / "garbled.gguf"
    garbled.write_bytes(data[:32] + b"\xff" + data[33:])  # the first key's name (after its length at byte 24)
    with pytest.raises(MlxSpecError, match=r"corrupt header: a string in it is not UTF-8 text\)"):
        load_model(garbled)


def _metadata(tiny, **changes):
    """The tiny GGUF's metadata with keys replaced (None: removed)."""
    _, metadata = mx.load(str(tiny[0]), return_metadata=True)
    for key, value in changes.items():
        key = key.replace("__", ".")
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    return metadata


@pytest.mark.parametrize("changes,says", [
    ({"llama__attention__head_count": None}, "llama.attention.head_count is missing; an integer >= 1 is needed"),
    ({"llama__attention__head_count": mx.array(0)}, "head_count is 0"),
    ({"llama__attention__head_count": "four"}, "head_count is 'four'"),
    ({"llama__block_count": None}, "llama.block_count is missing"),
    ({"llama__rope__scaling__type": "dynamic", "llama__rope__scaling__factor": mx.array(4.0)},
     "rope scaling 'dynamic' is not supported for llama; 'linear' and 'yarn' are for llama"),
    ({"llama__rope__scaling__type": "yarn", "llama__rope__scaling__factor": mx.array(4.0)},
     "llama.rope.scaling.original_context_length is missing"),
    ({"llama__rope__scaling__type": "yarn", "llama__rope__scaling__factor": mx.array(1.0),
      "llama__rope__scaling__original_context_length": mx.array(32)}, "YaRN factor llama.rope.scaling.factor is 1"),
    ({"llama__rope__scaling__type": "linear"}, "rope.scaling.factor is missing"),
    ({"llama__rope__scaling__attn_factor": mx.array(0.8)}, "rope.scaling.attn_factor to 0.8 with no RoPE scaling"),
    ({"llama__rope__scaling__type": "linear", "llama__rope__scaling__factor": mx.array(2.0),
      "llama__rope__scaling__attn_factor": mx.array(0.5)}, "to 0.5 with 'linear' RoPE scaling; only 1"),
    ({"llama__vocab_size": None, "tokenizer__ggml__tokens": None}, "neither llama.vocab_size nor"),
])
def test_metadata_it_cannot_build_from_is_said(tiny, changes, says):
    metadata = _metadata(tiny, **changes)
    with pytest.raises(IncompatibleModelsError, match=re.escape(says)):
        gguf_arch.model_args_from_metadata(metadata, [])


@pytest.mark.parametrize("changes,says", [
    ({"tokenizer__ggml__tokens": None}, "no vocabulary"),
    ({"tokenizer__ggml__merges": None}, "no merges"),  # one token per byte: it loaded and spoke garbage
    ({"tokenizer__ggml__merges": ["zzqq xxyy"]}, "do not fit together"),
    ({"tokenizer__ggml__eos_token_id": mx.array(10**6)}, "end-of-text token id 1000000 is outside"),
    ({"tokenizer__ggml__model": "llama"}, r"sentencepiece vocabulary has no scores"),
    ({"tokenizer__ggml__model": "bert"}, r"'bert' is not supported; supported: byte-level BPE \('gpt2'.*"
                                         r"sentencepiece BPE \('llama'"),
])
def test_a_tokenizer_it_cannot_build_is_said(tiny, changes, says):
    from mlxspec.loading.gguf_tokenizer import tokenizer_from_gguf

    with pytest.raises(IncompatibleModelsError, match=says):
        tokenizer_from_gguf(_metadata(tiny, **changes))


def test_header_faults_name_the_file(tiny, tmp_path):
    import struct

    data = bytearray(tiny[0].read_bytes())
    newer = tmp_path / "v99.gguf"
    newer.write_bytes(data[:4] + struct.pack("<I", 99) + data[8:])
    with pytest.raises(MlxSpecError, match=rf"{newer}.*version 99 is not read \(versions 2 and 3 are\)"):
        load_model(newer)
    huge = tmp_path / "strlen.gguf"  # the first key's length with its top byte set: past any file
    huge.write_bytes(data[:24] + struct.pack("<Q", 2**63 + 5) + data[32:])
    with pytest.raises(MlxSpecError, match=str(huge)):
        load_model(huge)


def test_a_refusal_names_the_file_it_is_about(tmp_path):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, arch="gpt2")
    with pytest.raises(IncompatibleModelsError, match=rf"^{re.escape(str(path))}: GGUF architecture 'gpt2'"):
        load_model(path)
