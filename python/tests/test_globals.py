"""Module-level names resolved from the imported module's globals: a launch converts its kernel
with the helper, builtin and constant that the running program bound, whatever tilegrad's own
reading of the module's top level makes of the conditions around them, and notes nothing. Runs
with torch blocked (numpy arrays only)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

HERE = pathlib.Path(__file__).resolve().parent

PRELUDE = textwrap.dedent(
    """
    import os
    import sys
    sys.modules["torch"] = None  # import torch raises ImportError
    sys.path.insert(0, %r)
    os.environ["TG_TEST_SWITCH"] = %r
    import numpy as np
    import tilegrad
    from tilegrad import _intercept, _native
    import kernels_globals as G

    def launch(x, kernel=G.apply_helper):
        calls = []

        def handler(call):
            calls.append(call)
            call.run()

        y = np.full_like(x, np.nan)
        with _intercept.intercepting(handler):
            kernel[(2,)](x, y, x.size, BLOCK=64)
        return y, calls[0].kernel

    def convert_alone(kernel=G.apply_helper):
        # The converter on its own: the program's facts, not its globals.
        file, src = _intercept._source(kernel.fn)
        return _native.convert(src, file, kernel.fn.__name__, [("BLOCK", "int", 64)], [("x_ptr", "f32"), ("y_ptr", "f32")],
                               [("n", "i32")], [], False, *_intercept._program_facts())
    """
)


def run_without_torch(switch: str, body: str) -> str:
    code = PRELUDE % (str(HERE), switch) + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_a_launch_uses_the_helper_builtin_and_constant_the_program_bound():
    out = run_without_torch(
        "1",
        """
        assert G.helper is G._jit_double and G.to_f32 is G.tl.cast and G.SCALE == 3.0
        x = np.linspace(-2.0, 2.0, 100).astype(np.float32)
        y, kernel = launch(x)
        np.testing.assert_allclose(y, (x * 2.0) * 3.0, rtol=1e-6)
        assert kernel.notes() == [], kernel.notes()
        # Alone, the converter reads `_fast_path()` as false: it cannot bind SCALE at all, and
        # takes `_jit_square` for `helper`, with a note.
        try:
            convert_alone()
            raise AssertionError("SCALE should be unbound without the program's globals")
        except tilegrad.UsageError as e:
            assert "SCALE" in str(e), e
        notes = convert_alone(G.helper_only).notes()
        assert len(notes) == 1 and "`helper`" in notes[0] and "_fast_path()" in notes[0], notes
        y, kernel = launch(x, G.helper_only)
        np.testing.assert_allclose(y, x * 2.0, rtol=1e-6)
        assert kernel.notes() == [], kernel.notes()
        print("ok")
        """,
    )
    assert "ok" in out


def test_a_helper_bound_in_the_else_branch_is_the_one_that_runs():
    out = run_without_torch(
        "0",
        """
        assert G.to_f32 is not G.tl.cast
        x = np.linspace(-2.0, 2.0, 100).astype(np.float32)
        y, kernel = launch(x)
        np.testing.assert_allclose(y, (x * 2.0 + 100.0) * 3.0, rtol=1e-6)
        assert kernel.notes() == [], kernel.notes()
        print("ok")
        """,
    )
    assert "ok" in out
