"""mlxspec.blas: which BLAS MLX's CPU matmuls use. Each case runs in a fresh interpreter,
because the choice is made once per process, before mlx.core is imported."""

import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# A float32 matmul through MLX's CPU stream against numpy in float64: the error bound of a
# 576-term float32 dot product of O(1) values, with room for any summation order.
CHECK = textwrap.dedent("""
    import json, sys
    import mlxspec, mlxspec.blas as blas
    import mlx.core as mx, numpy as np
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 576)).astype(np.float32), rng.standard_normal((576, 300)).astype(np.float32)
    got = np.array(mx.matmul(mx.array(a), mx.array(b), stream=mx.cpu))
    err = float(np.abs(got - a.astype(np.float64) @ b.astype(np.float64)).max())
    print(json.dumps({"info": blas.info(), "fast": blas.fast(), "err": err}))
""")


def run(code: str, blas_env: str | None):
    env = dict(os.environ)
    env.pop("MLXSPEC_BLAS", None)
    if blas_env is not None:
        env["MLXSPEC_BLAS"] = blas_env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def checked(blas_env):
    p = run(CHECK, blas_env)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["err"] < 576 * 2.0 ** -24 * 30, out  # n * u * (|a||b| ~ 30 at most here)
    return out


def test_off_keeps_mlx_own_blas():
    out = checked("off")
    assert out["info"]["name"] in ("reference", "mlx", "accelerate") and not out["fast"]


def test_auto_is_correct_and_says_what_it_loaded():
    out = checked(None)
    name = out["info"]["name"]
    assert name in ("openblas", "blis", "reference", "mlx", "accelerate")
    if name == "reference":
        assert "install OpenBLAS" in out["info"]["note"]  # the hint names the fix
    assert out["fast"] == (name in ("openblas", "blis"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="explicit libraries are a Linux matter")
def test_explicit_library_is_loaded():
    from mlxspec.blas import bundled_reference, find

    path = find("openblas") or bundled_reference()
    if path is None:
        pytest.skip("no BLAS library on this machine to name")
    out = checked(path)
    assert out["info"] == {"name": "custom", "path": path, "note": f"MLXSPEC_BLAS={path}"} and out["fast"]


@pytest.mark.parametrize("value, why", [
    ("/no/such/libblas.so", "cannot open shared object file"),
    ("LIBM", "does not export cblas_sgemm"),
])
def test_bad_library_is_a_clear_error(value, why):
    if value == "LIBM":
        value = ctypes.util.find_library("m")
        if value is None or not sys.platform.startswith("linux"):
            pytest.skip("no libm to name")
    p = run("import mlxspec", value)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("mlxspec.errors.InvalidArgumentError") and why in last
    assert "'auto'" in last and "'off'" in last and "cblas_sgemm" in last


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="explicit libraries are a Linux matter")
def test_too_late_when_mlx_came_first():
    from mlxspec.blas import bundled_reference

    path = bundled_reference()
    if path is None:
        pytest.skip("MLX does not bundle a BLAS here")
    p = run("import mlx.core\n" + CHECK, path)
    assert p.returncode == 0, p.stderr
    assert f"MLXSPEC_BLAS={path!r} ignored: mlx.core was imported before mlxspec" in p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["info"]["name"] == "reference" and not out["fast"]


def test_find_reads_the_linkers_cache_then_the_usual_folders(monkeypatch, tmp_path):
    from mlxspec import blas

    cache = ("\tlibopenblasp-r0.3.21.so (libc6,x86-64) => /elsewhere/libopenblasp-r0.3.21.so",
             "\tlibopenblas.so.0 (libc6,x86-64) => /cache/libopenblas.so.0")
    monkeypatch.setattr(blas, "_ldconfig", lambda: cache)
    monkeypatch.setattr(blas, "_FALLBACK_DIRS", (str(tmp_path),))
    assert blas.find("openblas") == "/cache/libopenblas.so.0"
    assert blas.find("blis") is None
    (tmp_path / "libblis.so.4").write_bytes(b"")
    assert blas.find("blis") == str(tmp_path / "libblis.so.4")


def test_a_folder_named_mlx_beside_the_script_does_not_hide_the_bundled_blas(tmp_path):
    """`mlx` is a namespace package, so an unrelated folder named mlx in the script's directory
    comes first in its path; the reference BLAS must still be found (and replaced)."""
    from mlxspec.blas import bundled_reference

    if bundled_reference() is None:
        pytest.skip("MLX does not bundle a BLAS here")
    (tmp_path / "mlx").mkdir()
    script = tmp_path / "probe.py"
    script.write_text("import json, mlxspec.blas as b\nprint(json.dumps(b.bundled_reference()))\n")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == bundled_reference()
