import os
import sys

# tests/tiny.py is imported as `tiny` by the tests.
sys.path.insert(0, os.path.dirname(__file__))
