"""Run `mx.fast.metal_kernel` bodies on a CPU: the harness behind the kernel tests.

`EmulatedKernel` takes the same arguments as `mx.fast.metal_kernel` and is called the same
way, so the launch code of each kernel module runs unchanged against it. The body is
wrapped in the signature MLX generates (see `write_signature` in MLX's
`mlx/backend/metal/custom_kernel.cpp`): template parameters, `const device T* name
[[buffer(i)]]` per input (`constant` below 8 elements, a reference for 0-d inputs),
`name_shape` / `name_strides` / `name_ndim` when the body mentions them, outputs, then the
thread attributes the body mentions. That translation unit is compiled with g++ against
`emulator_prelude.h` (Metal built-ins as fibers + SIMD collectives), cached by source
hash, and called through ctypes. See README.md for what this can and cannot show.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import subprocess
import tempfile
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np

PRELUDE = Path(__file__).with_name("emulator_prelude.h")

# The attributes MLX detects in a body (name, type), in MLX's order.
METAL_ATTRIBUTES = [
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
]

MAX_CONSTANT_ARRAY_SIZE = 8  # MLX passes smaller inputs in the constant address space

# mx dtype -> (MLX's get_type_string, numpy dtype used to carry the bytes)
_TYPES = {
    mx.bool_: ("bool", np.bool_),
    mx.uint8: ("uint8_t", np.uint8),
    mx.uint16: ("uint16_t", np.uint16),
    mx.uint32: ("uint32_t", np.uint32),
    mx.uint64: ("uint64_t", np.uint64),
    mx.int8: ("int8_t", np.int8),
    mx.int16: ("int16_t", np.int16),
    mx.int32: ("int32_t", np.int32),
    mx.int64: ("int64_t", np.int64),
    mx.float16: ("float16_t", np.float16),
    mx.bfloat16: ("bfloat16_t", np.uint16),
    mx.float32: ("float", np.float32),
}


def type_string(dtype: mx.Dtype) -> str:
    if dtype not in _TYPES:
        raise TypeError(f"[emulator] dtype {dtype} is not supported; supported: {sorted(map(str, _TYPES))}")
    return _TYPES[dtype][0]


def _template_value(arg) -> tuple[str, str]:
    """(parameter kind, value as written in C++) of one template argument."""
    if isinstance(arg, mx.Dtype):
        return "typename", type_string(arg)
    if isinstance(arg, bool):
        return "bool", "1" if arg else "0"  # MLX streams a bool as 0/1 too
    if isinstance(arg, int):
        return "int", str(arg)
    raise TypeError(f"[emulator] template arguments must be int, bool or mx.Dtype, got {arg!r}")


def write_signature(func_name, header, source, input_names, inputs, output_names, output_dtypes,
                    template, attributes, shape_infos, atomic_outputs=False) -> str:
    """The kernel source MLX generates, line for line (minus the host_name instantiation)."""
    src = header
    if template:
        src += "template <" + ", ".join(f"{_template_value(a)[0]} {n}" for n, a in template) + ">\n"
    src += f"[[kernel]] void {func_name}(\n"
    index = 0
    for name, arr, info in zip(input_names, inputs, shape_infos):
        location = "constant" if arr.size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if arr.ndim == 0 else "*"
        src += f"  const {location} {type_string(arr.dtype)}{ref} {name} [[buffer({index})]],\n"
        index += 1
        if arr.ndim > 0:
            if info[0]:
                src += f"  const constant int* {name}_shape [[buffer({index})]],\n"
                index += 1
            if info[1]:
                src += f"  const constant int64_t* {name}_strides [[buffer({index})]],\n"
                index += 1
            if info[2]:
                src += f"  const constant int& {name}_ndim [[buffer({index})]],\n"
                index += 1
    params = []
    for name, dtype in zip(output_names, output_dtypes):
        t = type_string(dtype)
        params.append(f"  device {'atomic<' + t + '>' if atomic_outputs else t}* {name} [[buffer({index})]]")
        index += 1
    params += [f"  {typ} {attr} [[{attr}]]" for attr, typ in attributes]
    src += ",\n".join(params) + ") {\n"
    src += source
    src += "\n}\n"
    return src


_TG_VARIABLE = re.compile(r"\bthreadgroup\s+((?:const\s+)?[A-Za-z_][\w:<>]*)\s+([A-Za-z_]\w*)\s*(\[|;)")


def emulate_address_spaces(code: str) -> str:
    """`threadgroup T name[N];` -> one object per group (a thread_local static, see the prelude).

    Every other `threadgroup` (a pointer's address space) is dropped like `device`.
    """
    code = _TG_VARIABLE.sub(r"static thread_local \1 \2\3", code)
    return re.sub(r"\bthreadgroup\b", "", code)


def _cache_dir() -> Path:
    root = os.environ.get("MLXSPEC_EMULATOR_CACHE")
    path = Path(root) if root else Path(tempfile.gettempdir()) / f"mlxspec-emulator-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


_LIBS: dict[str, ctypes.CDLL] = {}
_LOCK = threading.Lock()


def compile_library(code: str) -> ctypes.CDLL:
    """Compile a translation unit (prelude included by path) once per content hash."""
    prelude = PRELUDE.read_text()
    flags = os.environ.get("MLXSPEC_EMULATOR_CXXFLAGS", "")
    digest = hashlib.sha256((prelude + "\0" + flags + "\0" + code).encode()).hexdigest()[:24]
    with _LOCK:
        if digest in _LIBS:
            return _LIBS[digest]
        out = _cache_dir() / f"k_{digest}.so"
        if not out.exists():
            cpp = out.with_suffix(".cpp")
            cpp.write_text(code)
            tmp = out.with_suffix(f".{os.getpid()}.tmp.so")
            cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                   "-fno-fast-math", "-Wno-attributes", "-Wno-unused-variable", "-Wno-unknown-pragmas",
                   *flags.split(),
                   f"-I{PRELUDE.parent}", str(cpp), "-o", str(tmp)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"[emulator] the kernel did not compile:\n{proc.stderr[-6000:]}\n(source: {cpp})")
            os.replace(tmp, out)
        lib = ctypes.CDLL(str(out))
        lib.mlxemu_run.restype = ctypes.c_int
        lib.mlxemu_run.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_longlong),
                                   ctypes.POINTER(ctypes.c_longlong), ctypes.c_char_p, ctypes.c_int]
        _LIBS[digest] = lib
        return lib


def _to_numpy(a: mx.array) -> np.ndarray:
    if a.dtype == mx.bfloat16:
        a = a.view(mx.uint16)
    return np.ascontiguousarray(np.array(a, copy=False))


def _from_numpy(x: np.ndarray, dtype: mx.Dtype) -> mx.array:
    out = mx.array(x)
    return out.view(mx.bfloat16) if dtype == mx.bfloat16 else out


class EmulatedKernel:
    """Drop-in for the callable `mx.fast.metal_kernel(...)` returns, run by the CPU harness.

    Outputs without `init_value` start filled with a poison pattern (NaN / 0x7f.. bytes), so
    an element the kernel forgets to write shows up in comparisons.
    """

    def __init__(self, name, input_names, output_names, source, header="", ensure_row_contiguous=True,
                 atomic_outputs=False, compile_options=None):
        if atomic_outputs:
            raise NotImplementedError("[emulator] atomic_outputs is not emulated")
        self.name = name
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.source = source
        self.header = header
        self.shape_infos = [(f"{n}_shape" in source, f"{n}_strides" in source, f"{n}_ndim" in source)
                            for n in self.input_names]
        self.attributes = [(a, t) for a, t in METAL_ATTRIBUTES if a in source]

    def translation_unit(self, inputs, output_dtypes, template) -> str:
        func = f"custom_kernel_{self.name}"
        sig = write_signature(func, self.header, self.source, self.input_names, inputs, self.output_names,
                              output_dtypes, template, self.attributes, self.shape_infos)
        targs = "<" + ", ".join(_template_value(a)[1] for _, a in template) + ">" if template else ""
        args, b = [], 0
        for arr, info in zip(inputs, self.shape_infos):
            t = type_string(arr.dtype)
            args.append(f"*static_cast<const {t}*>(b[{b}])" if arr.ndim == 0 else f"static_cast<const {t}*>(b[{b}])")
            b += 1
            if arr.ndim > 0:
                for flag, ctype, deref in ((info[0], "int", ""), (info[1], "int64_t", ""), (info[2], "int", "*")):
                    if flag:
                        args.append(f"{deref}static_cast<const {ctype}*>(b[{b}])")
                        b += 1
        for dtype in output_dtypes:
            args.append(f"static_cast<{type_string(dtype)}*>(b[{b}])")
            b += 1
        args += [f"__t.{attr}" for attr, _ in self.attributes]
        call = f"{func}{targs}(\n      " + ",\n      ".join(args) + ");"
        return (
            '#include "emulator_prelude.h"\n' + emulate_address_spaces(sig) +
            '\nextern "C" int mlxemu_run(void** b, const long long* grid, const long long* tg, char* err, int errlen) {\n'
            "  return mlxemu::launch(grid, tg, err, errlen, [&](const mlxemu::Thread& __t) {\n"
            f"    {call}\n  }});\n}}\n"
        )

    def __call__(self, *, inputs, output_shapes, output_dtypes, grid, threadgroup, template=None,
                 init_value=None, verbose=False, stream=None):
        inputs = [x if isinstance(x, mx.array) else mx.array(x) for x in inputs]
        if len(inputs) != len(self.input_names):
            raise ValueError(f"[emulator] expected {len(self.input_names)} inputs, got {len(inputs)}")
        template = list(template or [])
        code = self.translation_unit(inputs, output_dtypes, template)
        if verbose:
            print(code)
        lib = compile_library(code)
        keep, ptrs = [], []

        def add(arr: np.ndarray):
            keep.append(arr)
            ptrs.append(arr.ctypes.data)

        for arr, info in zip(inputs, self.shape_infos):
            add(_to_numpy(arr))
            if arr.ndim > 0:
                strides = np.cumprod((list(arr.shape[1:]) + [1])[::-1])[::-1]  # row contiguous
                if info[0]:
                    add(np.array(arr.shape, np.int32))
                if info[1]:
                    add(np.array(strides, np.int64))
                if info[2]:
                    add(np.array([arr.ndim], np.int32))
        outs = []
        for shape, dtype in zip(output_shapes, output_dtypes):
            np_dtype = _TYPES[dtype][1]
            if init_value is not None:
                o = np.asarray(_to_numpy(mx.full(shape, init_value, dtype)))
                o = np.array(o, copy=True)
            elif np.issubdtype(np_dtype, np.floating) and dtype != mx.bfloat16:
                o = np.full(shape, np.nan, np_dtype)
            else:
                nbytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
                o = np.full(nbytes, 0x7F, np.uint8).view(np_dtype).reshape(shape)
            outs.append(o)
            add(o)
        buf = (ctypes.c_void_p * len(ptrs))(*ptrs)
        err = ctypes.create_string_buffer(1024)
        g = (ctypes.c_longlong * 3)(*grid)
        tg = (ctypes.c_longlong * 3)(*threadgroup)
        if lib.mlxemu_run(buf, g, tg, err, len(err)) != 0:
            raise RuntimeError(f"[emulator] kernel {self.name}: {err.value.decode()}")
        return [_from_numpy(o, d) for o, d in zip(outs, output_dtypes)]
