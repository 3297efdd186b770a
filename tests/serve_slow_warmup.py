"""`mlxspec serve` whose engine warms up for a minute, for the signal test during warm-up.

    python tests/serve_slow_warmup.py PORT
"""

import sys
import time

from serve_helpers import tiny_engine

from mlxspec.serve import ServeOptions, serve

if __name__ == "__main__":
    engine = tiny_engine()
    engine.warmup = lambda **kw: (print("warming up", flush=True), time.sleep(60))
    sys.exit(serve(engine, ServeOptions(port=int(sys.argv[1]), log_level="info")))
