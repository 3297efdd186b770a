"""device.adopt_attention: importing mlxspec keeps MLX's CUDA attention off cuDNN unless the user chose."""

import os
import subprocess
import sys

from mlxspec.device import CUDNN_SDPA_VAR

SHOW = f"import os, mlxspec; print(os.environ.get({CUDNN_SDPA_VAR!r}))"


def _run(extra_env):
    env = {k: v for k, v in os.environ.items() if k != CUDNN_SDPA_VAR}
    env.update(extra_env)
    p = subprocess.run([sys.executable, "-c", SHOW], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_import_turns_cudnn_attention_off():
    assert _run({}) == "0"


def test_a_users_choice_is_kept():
    assert _run({CUDNN_SDPA_VAR: "1"}) == "1"


def test_a_cuda_report_says_whether_attention_may_take_cudnn(monkeypatch):
    from mlxspec import device

    monkeypatch.setattr(device, "backend", lambda: "cuda")
    monkeypatch.setenv(CUDNN_SDPA_VAR, "0")
    assert device.describe()["cudnn_attention"] is False
    monkeypatch.setenv(CUDNN_SDPA_VAR, "1")
    assert device.describe()["cudnn_attention"] is True
    monkeypatch.setattr(device, "backend", lambda: "cpu")
    assert "cudnn_attention" not in device.describe()


def test_the_bench_footer_says_when_cuda_attention_ran_without_cudnn():
    from mlxspec.bench.report import device_line

    cuda = {"backend": "cuda", "name": "NVIDIA H100 80GB HBM3", "os": "Linux", "blas": "openblas"}
    assert device_line({**cuda, "cudnn_attention": False}).endswith("attention without cuDNN")
    assert "cuDNN" not in device_line({**cuda, "cudnn_attention": True})
