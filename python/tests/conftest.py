"""Shared setup of the tilegrad package's tests: the tests that need torch or triton skip where
they are not installed; the numpy-only tests always run."""

import sys
import pathlib

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
