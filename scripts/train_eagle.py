"""Train an EAGLE head: `mlxspec train-eagle`'s flags (--help), plus --gguf, the PyTorch trainer
the demo head was made with (mlxspec/training/, the model card's "Training").

    python scripts/train_eagle.py --target REF --out my-head --prompt-file chats.jsonl
    python scripts/train_eagle.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf --work WORKDIR --seed 0 --out my-head
"""

from __future__ import annotations

import os
import sys


def pytorch_run(argv) -> bool:
    """Whether `argv` asks for --gguf (as argparse reads it: --gguf=F, or a prefix such as --gg)."""
    return any(len(a.split("=")[0]) >= 4 and "--gguf".startswith(a.split("=")[0]) for a in argv)


if __name__ == "__main__":
    if pytorch_run(sys.argv[1:]):
        # `import mlxspec` puts a system OpenBLAS in the process's global symbol scope for MLX
        # (mlxspec.blas), and torch loaded after it runs its matmuls there, 3.5x slower here: MLX
        # keeps its own BLAS in this process, which runs it only to export the head
        os.environ.setdefault("MLXSPEC_BLAS", "off")
    from mlxspec.training import train_common, train_eagle

    train_common.run_main(train_eagle.main)
