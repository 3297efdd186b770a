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
