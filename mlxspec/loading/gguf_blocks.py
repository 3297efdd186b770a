"""GGML's quantized blocks as MLX's affine quantization (`w = scale * q + bias`, groups of 32).

`mx.load` keeps Q4_0 / Q4_1 / Q8_0 quantized and silently expands every other type to
float16 (twice the bytes of a Q8 model, four times a Q4's, all at once). The types below
are groups of 32 weights sharing one scale and one offset, which is MLX's layout exactly,
so they are rewritten bit for bit, from the memory-mapped file, one tensor at a time:

| ggml | a group of 32 | as MLX |
|---|---|---|
| Q4_0, Q5_0, Q8_0 | `d * (q - 2^(b-1))` | bits b, scale d, bias `-2^(b-1) d` |
| Q4_1, Q5_1 | `d * q + m` | bits b, scale d, bias m |
| Q4_K, Q5_K | `d * sc * q - dmin * m` (6-bit sc, m per 32; d, dmin per 256) | bits 4 / 5, scale `d * sc`, bias `-dmin * m` |

Scales and biases come back in float32, where `d * sc` is exact (11 + 6 significant bits).
Types with groups of 16 (Q6_K, Q3_K, Q2_K) or codebooks (IQ*) have no such form (MLX's
smallest group is 32): `as_float` decodes any type to float32 through `gguf`'s dequantizer.

MXFP4 (gpt-oss's experts) is MLX's "mxfp4" mode exactly: groups of 32 FP4 (E2M1) codes under
one power-of-two scale byte (E8M0), no bias. ggml stores a block's first 16 codes in the low
nibbles and the next 16 in the high ones; MLX packs neighbours, so only the order changes
(`as_mxfp4`).
"""

from __future__ import annotations

import numpy as np

GROUP = 32
# ggml type -> (bits, bytes per block of its own); a K-quant block holds 8 groups of 32.
AFFINE = {"Q4_0": (4, 18), "Q4_1": (4, 20), "Q5_0": (5, 22), "Q5_1": (5, 24), "Q8_0": (8, 34),
          "Q4_K": (4, 144), "Q5_K": (5, 176)}


def as_affine(raw: np.ndarray, type_name: str, rows: int, cols: int):
    """`(weight uint32 packed as MLX packs it, scales float32, biases float32, bits)` of a tensor.

    `raw` is the tensor's bytes (uint8, any shape holding rows * cols weights in ggml's
    order: each row's blocks in turn).
    """
    codes, scales, biases, bits = _decode(raw, type_name, rows, cols)
    return pack(codes, bits), scales, biases, bits


def as_mxfp4(raw: np.ndarray, rows: int, cols: int):
    """`(weight uint32 packed as MLX packs it, scales uint8)` of an MXFP4 tensor, for MLX's
    "mxfp4" mode (group size 32, 4 bits): the same codes and scale bytes, bit for bit."""
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // GROUP, 1 + GROUP // 2)
    qs = blocks[..., 1:]
    even, odd = qs[..., 0::2], qs[..., 1::2]  # ggml bytes 2j, 2j + 1: codes 2j, 2j + 1 low, 2j + 16, 2j + 17 high
    packed = np.empty(qs.shape, np.uint8)  # MLX byte j: codes 2j (low nibble) and 2j + 1 (high)
    packed[..., :8] = (even & 0x0F) | (odd << 4)
    packed[..., 8:] = (even >> 4) | (odd & 0xF0)
    return packed.reshape(rows, -1).view(np.uint32), np.ascontiguousarray(blocks[..., 0])


def as_float(raw: np.ndarray, type_name: str, rows: int, cols: int) -> np.ndarray:
    """The tensor in float32, (rows, cols), for any type `gguf` can dequantize.

    AFFINE types are formed here, `scale * q + bias`: the product is exact in float32, so the
    one rounding is ggml's (its dequantizer gives the same bits)."""
    if type_name in AFFINE:
        codes, scales, biases, _ = _decode(raw, type_name, rows, cols)
        groups = codes.reshape(rows, -1, GROUP) * scales[..., None] + biases[..., None]
        return groups.reshape(rows, cols)
    from gguf import GGMLQuantizationType, quants

    out = quants.dequantize(np.ascontiguousarray(raw).reshape(rows, -1), GGMLQuantizationType[type_name])
    return np.asarray(out, dtype=np.float32).reshape(rows, cols)


def _decode(raw, type_name, rows, cols):
    """`(codes uint8 (rows, cols), scales float32 (rows, cols / 32), biases float32, bits)`."""
    bits, size = AFFINE[type_name]
    per_block = 256 if type_name.endswith("_K") else GROUP
    blocks = np.ascontiguousarray(raw).reshape(rows, cols // per_block, size)
    codes, scales, biases = _DECODERS[type_name](blocks)
    return (codes.reshape(rows, cols), scales.reshape(rows, -1).astype(np.float32),
            biases.reshape(rows, -1).astype(np.float32), bits)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """b-bit codes (uint8, rows x cols) packed as MLX packs them: a little-endian bit stream per row."""
    rows, cols = codes.shape
    if bits == 8:
        packed = codes
    elif bits == 4:
        packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    else:  # 8 codes make `bits` whole bytes; each code's bits go into the one or two bytes they span
        eight = codes.reshape(rows, cols // 8, 8)
        out = np.zeros((rows, cols // 8, bits), np.uint8)
        for i in range(8):
            start = i * bits  # code i's first bit in its group's stream
            for k in range(start // 8, (start + bits - 1) // 8 + 1):
                shift = start - 8 * k  # uint8 shifts drop what falls outside byte k
                out[..., k] |= eight[..., i] << shift if shift >= 0 else eight[..., i] >> -shift
        packed = out.reshape(rows, cols * bits // 8)
    return np.ascontiguousarray(packed).view(np.uint32)


def _f16(blocks, start):
    return blocks[..., start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs):
    """16 bytes -> 32 codes: the low nibbles are the first 16 weights, the high ones the next 16."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh):
    """4 bytes (a little-endian uint32) -> bit j for weight j."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _q4_0(b):
    d = _f16(b, 0)
    return _nibbles(b[..., 2:18]), d, -8 * d


def _q4_1(b):
    return _nibbles(b[..., 4:20]), _f16(b, 0), _f16(b, 2)


def _q5_0(b):
    d = _f16(b, 0)
    return _nibbles(b[..., 6:22]) | (_high_bits(b[..., 2:6]) << 4), d, -16 * d


def _q5_1(b):
    return _nibbles(b[..., 8:24]) | (_high_bits(b[..., 4:8]) << 4), _f16(b, 0), _f16(b, 2)


def _q8_0(b):
    d = _f16(b, 0)
    return b[..., 2:34] ^ 0x80, d, -128 * d  # int8 q + 128 as uint8


def _k_scales(b):
    """A K-quant block's 8 six-bit scales and mins (ggml's get_scale_min_k4), scaled by d and dmin."""
    s = b[..., 4:16].astype(np.uint8)
    low, high = s[..., 0:4], s[..., 8:12]
    sc = np.concatenate([low & 63, (high & 0x0F) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([s[..., 4:8] & 63, (high >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    return _f16(b, 0) * sc, -_f16(b, 2) * mins


def _q4_k(b):
    qs = b[..., 16:144].reshape(*b.shape[:-1], 4, 32)  # 4 chunks of 64 weights: low nibbles, then high
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2)  # (..., 4, 2, 32): groups in order
    scales, biases = _k_scales(b)
    return codes, scales, biases


def _q5_k(b):
    qh = b[..., 16:48]  # bit 2j of qh[l]: group 2j's high bit at l; bit 2j+1: group 2j+1's
    qs = b[..., 48:176].reshape(*b.shape[:-1], 4, 32)
    shifts = np.arange(8, dtype=np.uint8).reshape(4, 2, 1)
    high = ((qh[..., None, None, :] >> shifts) & 1) << 4  # (..., 4, 2, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2) | high
    scales, biases = _k_scales(b)
    return codes, scales, biases


_DECODERS = {"Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1, "Q8_0": _q8_0,
             "Q4_K": _q4_k, "Q5_K": _q5_k}
