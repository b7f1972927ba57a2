"""A kernel module whose top level binds names under conditions only running it decides:
`_fast_path()` is a call tilegrad's reading of the file cannot evaluate (it reads the condition
as false), while Python, importing the module, takes the `if`. Used by test_globals.py."""

import os

import triton
import triton.language as tl


def _fast_path() -> bool:
    return all(hasattr(tl, n) for n in ("exp", "program_id"))


@triton.jit
def _jit_double(x):
    return x * 2.0


@triton.jit
def _jit_square(x):
    return x * x


if _fast_path():
    helper = _jit_double
else:
    helper = _jit_square

# Set by the test before the import: "1" takes `tl.cast`, anything else the jit helper.
if os.environ.get("TG_TEST_SWITCH") == "1" and _fast_path():
    to_f32 = tl.cast
else:

    @triton.jit
    def to_f32(x, dtype):
        return x.to(dtype) + 100.0


# Not a literal: without the program's value, tilegrad could not bind it at all.
SCALE = 3.0 if _fast_path() else 5.0


@triton.jit
def apply_helper(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = to_f32(helper(x), tl.float32) * SCALE
    tl.store(y_ptr + offs, y, mask=mask)


@triton.jit
def helper_only(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, helper(tl.load(x_ptr + offs, mask=mask)), mask=mask)
