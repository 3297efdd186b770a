"""Read the tensor table of a GGUF file (names, shapes, storage types) without its data.

`mx.load` reads GGUF tensors and metadata fast, but it silently dequantizes the types it
cannot keep quantized (K-quants become float16), so the storage type of each tensor comes
from here. `gguf.GGUFReader` gives the same answer but parses every metadata array into
NumPy objects (seconds for a 49k-token vocabulary); this scanner skips values instead.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError

# GGUF metadata value types -> struct format of a scalar (8 = string, 9 = array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost (columns) first, like ggml's ne[]
    type_name: str  # ggml type, e.g. "Q4_1", "F32"


def read_tensor_table(path: str | Path) -> list[TensorInfo]:
    """The tensor table of the GGUF file at `path`.

    Raises:
        MlxSpecError: the file is not GGUF or its header is truncated.
    """
    from gguf import GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return [
                TensorInfo(name, shape, _type_name(GGMLQuantizationType, t))
                for name, shape, t in _scan(buf)
            ]
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError) as e:
        raise MlxSpecError(
            f"{path} is not a readable GGUF file (truncated or corrupt header: {e}); "
            "download it again"
        ) from e


def _type_name(enum, t: int) -> str:
    try:
        return enum(t).name
    except ValueError:
        return f"unknown type {t}"


def _scan(buf):
    if buf[:4] != b"GGUF":
        raise ValueError("no GGUF magic number")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if not 2 <= version <= 3:
        raise ValueError(f"GGUF version {version} is not read (versions 2 and 3 are)")
    pos = 24
    for _ in range(n_kv):
        _, pos = _string(buf, pos)
        (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        pos = _skip_value(buf, pos, vtype)
    out = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        pos += 4 + 8 * n_dims
        ttype, _offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        out.append((name, tuple(shape), ttype))
    return out


def _string(buf, pos):
    (n,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + n
    if end > len(buf):
        raise ValueError("a string extends past the end of the file")
    return bytes(buf[pos + 8 : end]).decode("utf-8"), end


def _skip_value(buf, pos, vtype):
    if vtype in _SCALARS:
        return pos + struct.calcsize(_SCALARS[vtype])
    if vtype == _STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _SCALARS:
            return pos + count * struct.calcsize(_SCALARS[item])
        for _ in range(count):
            pos = _skip_value(buf, pos, item)
        return pos
    raise ValueError(f"unknown metadata value type {vtype}")
