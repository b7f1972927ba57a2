"""Torch function modes that run the user's host code as a check needs it.

- `PromoteFloats`: the ground truth's forward computes in f64, host code included: every float
  dtype the code asks for (`dtype=torch.float32`, `.to(torch.float16)`, `.float()`) becomes f64.
- `PoisonEmpty`: while the backward under test runs, `torch.empty*` allocations of floats start as
  NaN (as the CLI's `empty` allocations do), so an element the backward never writes shows up as
  NaN in the report instead of as whatever the allocator left there. Each allocation is recorded
  with the user's source line that made it, for blame.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_LOW = (torch.float16, torch.bfloat16, torch.float32)
_TO_DOUBLE = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}
_PKG = os.path.dirname(os.path.abspath(__file__))


def _promote(v: Any) -> Any:
    return torch.float64 if isinstance(v, torch.dtype) and v in _LOW else v


def _called_by_tilegrad() -> bool:
    """Whether the torch call a mode sees comes from tilegrad's own code (two frames up: the
    mode's `__torch_function__`, then its caller)."""
    return os.path.abspath(sys._getframe(2).f_code.co_filename).startswith(_PKG)


class PromoteFloats(TorchFunctionMode):
    """Every float dtype requested by host code becomes f64 (not tilegrad's own: its views of a
    storage keep the storage's dtype)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if _called_by_tilegrad():
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        if func in _TO_DOUBLE:
            return args[0].double()
        if "dtype" in kwargs:
            kwargs["dtype"] = _promote(kwargs["dtype"])
        if getattr(func, "__name__", "") in ("to", "type", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"):
            args = tuple(_promote(a) for a in args)
        return func(*args, **kwargs)


def _user_line() -> str:
    """file:line of the innermost frame outside torch and tilegrad."""
    for fr in reversed(traceback.extract_stack()):
        f = os.path.abspath(fr.filename)
        if f.startswith(_PKG) or f"{os.sep}torch{os.sep}" in f or fr.filename.startswith("<"):
            continue
        return f"{fr.filename}:{fr.lineno}"
    return "<unknown>"


_EMPTY = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


class PoisonEmpty(TorchFunctionMode):
    """`torch.empty*` float allocations are filled with NaN and recorded."""

    def __init__(self) -> None:
        super().__init__()
        # storage key -> (description, tensor)
        self.allocations: dict[tuple, tuple[str, torch.Tensor]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") in _EMPTY and isinstance(out, torch.Tensor) and out.is_floating_point():
            with torch.no_grad():
                out.fill_(float("nan"))
            key = ("torch", str(out.device), out.untyped_storage().data_ptr())
            self.allocations[key] = (f"{func.__name__} at {_user_line()}", out)
        return out


def in_sys_modules() -> bool:
    return "torch" in sys.modules
