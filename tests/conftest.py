import mlxspec  # noqa: F401  (first, as the CLI does: it picks MLX's CPU BLAS before mlx.core binds one)
import os
import sys

# tests/tiny.py is imported as `tiny` by the tests.
sys.path.insert(0, os.path.dirname(__file__))
