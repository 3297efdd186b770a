"""`mlxspec.serve.serve` on a tiny engine in its own process, for the signal tests.

    python tests/serve_tiny.py PORT SHUTDOWN_GRACE PER_TOKEN_SECONDS
"""

import sys

from serve_helpers import GatedEngine, tiny_engine

from mlxspec.serve import ServeOptions, serve

if __name__ == "__main__":
    port, grace, per_token = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    engine = GatedEngine(tiny_engine(), per_token_seconds=per_token)
    sys.exit(serve(engine, ServeOptions(port=port, shutdown_grace=grace, log_level="info")))
