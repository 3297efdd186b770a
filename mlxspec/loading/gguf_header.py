"""Read a GGUF file's header: its metadata and tensor table (names, shapes, types, offsets).

`mx.load` reads GGUF tensors and metadata fast, but it silently dequantizes the types it
cannot keep quantized (K-quants become float16), so the storage type of each tensor comes
from here, and so does the metadata of files `mx.load` should not read (`read_header`).
`gguf.GGUFReader` gives the same answers but parses every metadata array into NumPy objects
(seconds for a 49k-token vocabulary); `read_tensor_table` skips values instead.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from ..errors import MlxSpecError

# GGUF metadata value types -> struct format of a scalar (8 = string, 9 = array).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
          12: "<f8"}
DEFAULT_ALIGNMENT = 32  # GGUF's, when general.alignment is absent
# A part of a file split by llama.cpp's gguf-split: (name, part number, parts), e.g. NAME-00001-of-00003.gguf
SPLIT_PART = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: innermost (columns) first, like ggml's ne[]
    type_name: str  # ggml type, e.g. "Q4_1", "F32"
    offset: int = 0  # of its data, from the start of the file


def read_header(path: str | Path) -> tuple[dict, list[TensorInfo]]:
    """`(metadata, tensors)` of the GGUF file at `path`, reading no tensor data.

    Metadata values come as `mx.load(..., return_metadata=True)` gives them: strings as
    `str`, arrays of strings as `list[str]`, numbers and arrays of numbers as `mx.array`.

    Raises:
        MlxSpecError: the file is not GGUF, its header is truncated, or a tensor's data
            would lie past the end of the file.
    """
    from gguf import GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            metadata, table, end = _scan(buf, values=True)
            align = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
            if align < 1:
                raise ValueError(f"general.alignment is {align}")
            start = -(-end // align) * align
            size = len(buf)
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError) as e:
        raise _unreadable(path, e) from e
    tensors = [TensorInfo(name, shape, _type_name(GGMLQuantizationType, t), start + offset)
               for name, shape, t, offset in table]
    for t in tensors:
        if t.offset > size:
            raise _unreadable(path, f"tensor {t.name}'s data starts past the end of the file")
    return metadata, tensors


def _unreadable(path, why) -> MlxSpecError:
    return MlxSpecError(
        f"{path} is not a readable GGUF file (truncated or corrupt header: {_said(why)}); download it again"
    )


_PAST_END = re.compile(r"unpacking (\d+) bytes at offset (\d+) \(actual buffer size is (\d+)\)")


def _said(why) -> str:
    """Why a header did not read, in the file's terms rather than the struct module's."""
    if isinstance(why, struct.error) and (m := _PAST_END.search(str(why))):
        n, at, size = map(int, m.groups())
        return f"{n} bytes read at byte {at:,} run past the end of the file ({size:,} bytes)"
    if isinstance(why, UnicodeDecodeError):
        return "a string in it is not UTF-8 text"
    return str(why)


def read_tensor_table(path: str | Path) -> list[TensorInfo]:
    """The tensor table of the GGUF file at `path`.

    Raises:
        MlxSpecError: the file is not GGUF or its header is truncated.
    """
    from gguf import GGMLQuantizationType

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            _, table, _ = _scan(buf)
            return [TensorInfo(name, shape, _type_name(GGMLQuantizationType, t)) for name, shape, t, _ in table]
    except (struct.error, ValueError, UnicodeDecodeError, OverflowError) as e:
        raise _unreadable(path, e) from e


def _type_name(enum, t: int) -> str:
    try:
        return enum(t).name
    except ValueError:
        return f"unknown type {t}"


def _scan(buf, values: bool = False):
    """`(metadata, [(name, shape, type, offset)], end of the header)`; metadata only if `values`."""
    if buf[:4] != b"GGUF":
        raise ValueError("no GGUF magic number")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if not 2 <= version <= 3:
        raise ValueError(f"GGUF version {version} is not read (versions 2 and 3 are)")
    pos = 24
    metadata = {}
    for _ in range(n_kv):
        key, pos = _string(buf, pos)
        (vtype,), pos = struct.unpack_from("<I", buf, pos), pos + 4
        if values:
            metadata[key], pos = _value(buf, pos, vtype)
        else:
            pos = _skip_value(buf, pos, vtype)
    out = []
    for _ in range(n_tensors):
        name, pos = _string(buf, pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        shape = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        pos += 4 + 8 * n_dims
        ttype, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        out.append((name, tuple(shape), ttype, offset))
    return metadata, out, pos


def _string(buf, pos):
    (n,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + n
    if end > len(buf):
        raise ValueError("a string extends past the end of the file")
    return bytes(buf[pos + 8 : end]).decode("utf-8"), end


def _value(buf, pos, vtype):
    """One metadata value and the position after it, in mx.load's conventions."""
    import mlx.core as mx
    import numpy as np

    if vtype in _NUMPY:
        return mx.array(np.frombuffer(buf, _NUMPY[vtype], 1, pos)[0]), pos + struct.calcsize(_SCALARS[vtype])
    if vtype == _STRING:
        return _string(buf, pos)
    if vtype == _ARRAY:
        item, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item in _NUMPY:
            end = pos + count * struct.calcsize(_SCALARS[item])
            if end > len(buf):
                raise ValueError("an array extends past the end of the file")
            return mx.array(np.frombuffer(buf, _NUMPY[item], count, pos)), end
        items = []
        for _ in range(count):
            value, pos = _value(buf, pos, item)
            items.append(value)
        return items, pos
    raise ValueError(f"unknown metadata value type {vtype}")


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
