"""GGUF files of K-quants and other types `mx.load` would expand: read tensor by tensor, kept
quantized where MLX's layout holds them bit for bit, against gguf's own dequantizer."""

from __future__ import annotations

import numpy as np
import pytest

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from tiny import float32_tol
from mlxspec.errors import MlxSpecError
from mlxspec.loading import load_model
from mlxspec.loading.gguf_blocks import AFFINE, as_affine, pack
from mlxspec.loading.precision import dequantized_weight

from gguf_reference import check_logits, reference_weights
from tiny_gguf import HEADS, KV_HEADS, random_blocks, write_tiny_gguf

# The mix of a Q4_K_M file and then some: every type the loader keeps, and three it requantizes.
K_TYPES = {
    "token_embd": "Q6_K", "attn_q": "Q4_K", "attn_k": "Q5_K", "attn_v": "Q5_0",
    "attn_output": "Q3_K", "ffn_gate": "Q5_1", "ffn_up": "Q2_K", "ffn_down": "Q4_K",
}
HELD_8BIT = {"Q6_K", "Q3_K", "Q2_K"}
ROLES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}


@pytest.fixture(scope="module")
def kfile(tmp_path_factory):
    path = tmp_path_factory.mktemp("kquant") / "k.gguf"
    trained = write_tiny_gguf(path, types=K_TYPES, tied=False, hidden=256, ffn=512, seed=5)
    return path, trained


@pytest.fixture
def no_mx_load(monkeypatch):
    """Fail if anything reads the file with mx.load, which would expand every K-quant to float16."""
    real = mx.load

    def guarded(path, *args, **kwargs):
        if str(path).endswith(".gguf"):
            raise AssertionError("mx.load read a GGUF this loader should read itself")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(mx, "load", guarded)


@pytest.mark.parametrize("type_name", sorted(AFFINE))
def test_blocks_become_mlx_triples_bit_for_bit(type_name):
    from gguf import GGMLQuantizationType, quants

    rng = np.random.default_rng(len(type_name))
    rows, cols = 5, 512
    raw = random_blocks(type_name, (rows, cols), 0.05, rng) if type_name.endswith("_K") else None
    if raw is None:  # every byte random, then sane float16 scales where the format has them
        from gguf import GGML_QUANT_SIZES

        size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]][1]
        raw = rng.integers(0, 256, size=(rows, cols // 32, size), dtype=np.uint8)
        n_scales = 2 if type_name in ("Q4_1", "Q5_1") else 1
        scales = rng.uniform(-0.1, 0.1, size=(rows, cols // 32, n_scales)).astype(np.float16)
        raw[..., : 2 * n_scales] = scales.view(np.uint8).reshape(rows, cols // 32, 2 * n_scales)
        raw = raw.reshape(rows, -1)
    weight, scales, biases, bits = as_affine(raw, type_name, rows, cols)
    assert bits == AFFINE[type_name][0] and scales.dtype == np.float32
    got = mx.dequantize(mx.array(weight), mx.array(scales), mx.array(biases), group_size=32, bits=bits)
    ref = quants.dequantize(raw, GGMLQuantizationType[type_name]).reshape(rows, cols)
    np.testing.assert_array_equal(np.array(got), ref.astype(np.float32))


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_codes_are_packed_as_mlx_packs_them(bits):
    codes = np.random.default_rng(bits).integers(0, 2**bits, size=(3, 96), dtype=np.uint8)
    ones, zeros = mx.ones((3, 3)), mx.zeros((3, 3))
    got = mx.dequantize(mx.array(pack(codes, bits)), ones, zeros, group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(got).astype(np.uint8), codes)


def test_float32_decodes_every_type_exactly(kfile, no_mx_load):
    path, trained = kfile
    model, _, info = load_model(path, dtype="float32")
    assert info.dtype == "float32" and "held as" not in info.quantization
    assert not any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())
    ref = reference_weights(path)
    layer = model.model.layers[1]
    for role, module in ROLES.items():
        got = np.array(dict(layer.named_modules())[module].weight)
        want = ref[f"blk.1.{role}.weight"]
        if role in ("attn_q", "attn_k"):  # rows come back in HF order; compare as sets of rows
            got, want = np.sort(got, axis=0), np.sort(want, axis=0)
        np.testing.assert_array_equal(got, want.astype(np.float32), err_msg=role)
    ids = trained.encode("def hello(name): 12345 🤖").ids
    check_logits(model, path, ids, float32_tol())


def test_kept_quantized_layers_hold_the_files_weights(kfile, no_mx_load):
    import gguf

    path, _ = kfile
    model, _, info = load_model(path, dtype="quantized")
    assert info.dtype == "quantized"
    assert info.quantization.startswith("GGUF Q4_K (") and info.quantization.endswith(
        "; Q2_K, Q3_K, Q6_K held as 8-bit")
    ref = reference_weights(path)
    raw = {t.name: t.data for t in gguf.GGUFReader(str(path)).tensors}
    modules = dict(model.named_modules())
    checked = {("output", "lm_head"), ("token_embd", "model.embed_tokens")}
    checked |= {(f"blk.0.{role}", f"model.layers.0.{m}") for role, m in ROLES.items()}
    for gguf_name, mlx_name in sorted(checked):
        kind = K_TYPES.get(gguf_name.removeprefix("blk.0."), "Q6_K")
        m = modules[mlx_name]
        assert isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)), mlx_name
        assert m.bits == (8 if kind in HELD_8BIT else AFFINE[kind][0]), mlx_name
        want = ref[gguf_name + ".weight"]
        rows, cols = want.shape
        if kind in HELD_8BIT:
            # up to one 8-bit step of the group's range (MLX moves the step so one end of the
            # range is exact), plus half a float16 ulp of the held scale and bias terms
            groups = want.reshape(rows, -1, 32)
            step = (groups.max(-1) - groups.min(-1)) / 255
            scales, biases = np.array(m.scales.astype(mx.float32)), np.array(m.biases.astype(mx.float32))
            bound = step + 2.0**-11 * (np.abs(scales) * 255 + np.abs(biases))
        else:
            # the file's own scale and bias per group, rounded to float16: half an ulp of each term
            _, scales, biases, bits = as_affine(raw[gguf_name + ".weight"], kind, rows, cols)
            bound = 2.0**-11 * (np.abs(scales) * (2**bits - 1) + np.abs(biases))
        got = np.array(dequantized_weight(m))
        heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(gguf_name.removeprefix("blk.0."))
        if heads:  # the loader's rows are in HF order: put the file's in it too
            want, bound = (_hf_rows(a, heads) for a in (want, bound))
        err = np.abs(got - want).reshape(rows, -1, 32).max(-1)
        assert (err <= bound * 1.001 + 1e-9).all(), (mlx_name, kind, float((err / (bound + 1e-30)).max()))


def _hf_rows(a, heads):
    return a.reshape(heads, a.shape[0] // heads // 2, 2, -1).swapaxes(1, 2).reshape(a.shape)


def test_auto_precision_is_chosen_before_the_file_is_read(kfile, no_mx_load):
    from mlxspec.loading.precision import default_dtype

    model, _, info = load_model(kfile[0])
    assert info.dtype == default_dtype()  # a tiny model fits any memory check
    quantized = any(isinstance(m, nn.QuantizedLinear) for _, m in model.named_modules())
    assert quantized == (info.dtype == "quantized")


def test_a_truncated_k_quant_file_is_named(kfile, tmp_path):
    data = kfile[0].read_bytes()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[: len(data) - 1000])
    with pytest.raises(MlxSpecError, match=rf"{bad} is truncated: tensor .* ends at byte"):
        load_model(bad, dtype="quantized")


def test_files_mx_load_keeps_still_go_through_it(tmp_path, monkeypatch):
    # The fast path stays for Q4_0/Q4_1/Q8_0/float files: mx.load reads them whole.
    path = tmp_path / "plain.gguf"
    write_tiny_gguf(path)
    calls = []
    real = mx.load
    monkeypatch.setattr(mx, "load", lambda *a, **k: calls.append(a) or real(*a, **k))
    load_model(path, dtype="quantized")
    assert len(calls) == 1


def test_header_metadata_reads_as_mx_load_gives_it(kfile, tmp_path):
    from mlxspec.loading.gguf_header import read_header

    plain = tmp_path / "plain.gguf"
    write_tiny_gguf(plain)  # a file mx.load reads whole: its metadata is the yardstick
    _, theirs = mx.load(str(plain), return_metadata=True)
    ours, tensors = read_header(plain)
    assert ours.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, mx.array):
            assert ours[key].dtype == value.dtype and mx.array_equal(ours[key], value).item(), key
        else:
            assert ours[key] == value, key
    assert len(tensors) == len({t.name for t in tensors}) > 0 and all(t.offset > 0 for t in tensors)


def test_a_split_gguf_loads_as_the_whole_file(tmp_path):
    # Split files are read part by part (never by mx.load, which reads one file): the same
    # layers, bit for bit, as mx.load gives for the whole file, whichever part is named.
    whole, split = tmp_path / "whole.gguf", tmp_path / "model.gguf"
    write_tiny_gguf(whole, seed=4)
    write_tiny_gguf(split, seed=4, split=9)
    parts = sorted(tmp_path.glob("model-*-of-*.gguf"))
    assert len(parts) == 3 and parts[0].name == "model-00001-of-00003.gguf"
    reference, _, info = load_model(whole, dtype="quantized")
    assert info.quantization.startswith("GGUF ")
    for named in (parts[0], parts[2]):
        model, tok, info = load_model(named, dtype="quantized")
        ours, theirs = dict(tree_flatten(model.parameters())), dict(tree_flatten(reference.parameters()))
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            assert ours[name].dtype == value.dtype and mx.array_equal(ours[name], value).item(), name
    assert tok.encode("hello") == load_model(whole)[1].encode("hello")
    for i in (0, 1):  # named as a split in 2: the first part's split.count says 3
        parts[i].rename(tmp_path / f"two-{i + 1:05d}-of-00002.gguf")
    with pytest.raises(MlxSpecError, match=r"two-00001-of-00002.gguf says its GGUF is split in 3, its name says 2"):
        load_model(tmp_path / "two-00002-of-00002.gguf")
    (tmp_path / "two-00002-of-00002.gguf").unlink()
    with pytest.raises(MlxSpecError, match=r"part 1 of a GGUF split in 2, and 1 part\(s\) are missing beside it: "
                                           r"two-00002-of-00002.gguf"):
        load_model(tmp_path / "two-00001-of-00002.gguf")


def test_a_large_file_read_tensor_by_tensor_shows_its_progress(kfile, monkeypatch):
    # on a terminal only (tqdm's disable=None), and only from PROGRESS_BYTES on
    import gguf
    import tqdm.auto

    from mlxspec.loading import gguf as gguf_loader

    bars = []

    class Recorder:
        def __init__(self, total, disable, **kw):
            self.total, self.disable, self.done, self.closed = total, disable, 0, False
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    path, _ = kfile
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    load_model(path, dtype="quantized")
    assert bars[-1].disable is True  # a small file: no bar
    monkeypatch.setattr(gguf_loader, "PROGRESS_BYTES", 1)
    load_model(path, dtype="quantized")
    tensor_bytes = sum(t.n_bytes for t in gguf.GGUFReader(str(path)).tensors)
    bar = bars[-1]
    assert bar.disable is None and bar.total == path.stat().st_size and bar.done == tensor_bytes and bar.closed
