import sys
from pathlib import Path

# Test helpers (tiny.py, tiny_gguf.py) import as top-level modules.
sys.path.insert(0, str(Path(__file__).parent))
