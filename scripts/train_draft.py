"""Train the demo draft model for SmolLM2-135M-Instruct by self-distillation (PyTorch, CPU, offline):
mlxspec/training/train_draft.py, whose --help says how.

    python scripts/train_draft.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --work WORKDIR --seed 0
"""

from __future__ import annotations

import os

if __name__ == "__main__":
    # `import mlxspec` puts a system OpenBLAS in the process's global symbol scope for MLX
    # (mlxspec.blas), and torch loaded after it runs its matmuls there, 3.5x slower: MLX keeps its
    # own BLAS in this process, which runs it only to export the draft
    os.environ.setdefault("MLXSPEC_BLAS", "off")
    from mlxspec.training import train_common, train_draft

    train_common.run_main(train_draft.main)
