"""Kernel pointer arguments as Triton sees them: a tensor is its data pointer.

A pointer argument is resolved to the *storage* it points into (a torch tensor's untyped storage,
a numpy array's owning buffer) and the element offset of its first element in that storage. The
engine runs the launch on whole storages, so views, strides, storage offsets and several arguments
aliasing one storage behave as on the GPU, and an access outside the storage is out of bounds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_TORCH_DTYPES = {
    "torch.bool": "i1",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float32": "f32",
    "torch.float64": "f64",
}
_NUMPY_DTYPES = {"bool": "i1", "int32": "i32", "int64": "i64", "float16": "f16", "float32": "f32", "float64": "f64"}


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "untyped_storage")


def is_array(x: Any) -> bool:
    return hasattr(x, "__array_interface__") and not is_torch(x)


def is_tensor(x: Any) -> bool:
    """A value Triton would pass as a pointer."""
    return is_torch(x) or is_array(x)


def dtype_name(x: Any) -> str:
    """tilegrad's name of a tensor's element dtype."""
    if is_torch(x):
        d = _TORCH_DTYPES.get(str(x.dtype))
    else:
        d = _NUMPY_DTYPES.get(str(x.dtype))
    if d is None:
        raise TypeError(f"tensors of dtype {x.dtype} are not supported (bool, int32, int64, float16, bfloat16, float32, float64 are)")
    return d


def _numpy_owner(a: Any) -> Any:
    """The outermost numpy array whose buffer `a` views."""
    import numpy as np

    while isinstance(getattr(a, "base", None), np.ndarray):
        a = a.base
    return a


@dataclass
class Storage:
    """One storage a launch touches: its address, length in elements of `dtype`, and the names
    of the arguments pointing into it. A CUDA storage is used in place by the GPU backend; for
    the CPU it gets a host copy (`host()`), copied back after the launch."""

    key: tuple
    dtype: str
    addr: int
    numel: int
    names: list[str] = field(default_factory=list)
    # A flat tensor over the whole storage (torch; for a CUDA storage its host copy, once
    # made), or the owning array (numpy).
    flat: Any = None
    # For CUDA storages: the device flat view.
    device_flat: Any = None

    def host_addr(self) -> int:
        """The address of the storage in host memory (a host copy of a CUDA storage, made once)."""
        if self.device_flat is None:
            return self.addr
        if self.flat is None:
            self.flat = self.device_flat.cpu()
        return self.flat.data_ptr()


def _torch() -> Any:
    import torch

    return torch


def torch_flat(t: Any) -> Any:
    """A flat 1-D tensor over the whole storage of `t` (sharing its memory)."""
    import torch

    s = t.untyped_storage()
    n = s.nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(s, 0, (n,), (1,))


def storage_of(x: Any) -> tuple[tuple, int, int, int, Any]:
    """(key, base address, elements, element offset of `x`, owner) of the storage `x` points into."""
    if is_torch(x):
        s = x.untyped_storage()
        base = s.data_ptr()
        es = x.element_size()
        return (("torch", str(x.device), base), base, s.nbytes() // es, x.storage_offset(), x)
    owner = _numpy_owner(x)
    base = owner.__array_interface__["data"][0]
    ptr = x.__array_interface__["data"][0]
    es = x.dtype.itemsize
    off = ptr - base
    if off % es:
        raise ValueError("an array that starts between two elements of its buffer cannot be a kernel argument")
    return (("numpy", base), base, owner.nbytes // es, off // es, owner)


class Storages:
    """The storages of one launch, in order of first use."""

    def __init__(self) -> None:
        self.items: list[Storage] = []

    def add(self, arg_name: str, x: Any) -> tuple[int, int]:
        """Registers argument `x` of parameter `arg_name`: (storage index, element offset)."""
        key, base, numel, offset, owner = storage_of(x)
        d = dtype_name(x)
        for i, s in enumerate(self.items):
            if s.key == key:
                if s.dtype != d:
                    raise TypeError(
                        f"arguments `{s.names[0]}` ({s.dtype}) and `{arg_name}` ({d}) view one storage with different dtypes; "
                        "tilegrad cannot reinterpret memory"
                    )
                s.names.append(arg_name)
                return i, offset
        st = Storage(key=key, dtype=d, addr=base, numel=numel, names=[arg_name])
        if is_torch(x):
            flat = torch_flat(x)
            if flat.device.type != "cpu":
                st.device_flat = flat
            else:
                st.flat = flat
        else:
            st.flat = owner
        self.items.append(st)
        return len(self.items) - 1, offset

    def in_place(self, executor: Any, promote: bool = False) -> bool:
        """Whether the launch runs on the storages where they are: every one a CUDA storage of
        the device the GPU backend runs on (device 0), `executor` that backend, and in f64
        (`promote`) every float storage f64 already."""
        if executor is None or not executor.on_gpu or not self.items:
            return False
        if promote and any(s.dtype in ("f16", "bf16", "f32") for s in self.items):
            return False
        return all(s.device_flat is not None and s.device_flat.device.type == "cuda" and (s.device_flat.device.index or 0) == 0 for s in self.items)

    def widened(self, executor: Any) -> dict[int, Any] | None:
        """For a launch in f64 over CUDA storages some of which are f32 (a replay in f64 whose
        host code allocates f32 buffers): f64 device copies of those, by storage index, so that
        it runs on the device too (`specs(widened=...)`, then `narrow_back`). None where the
        launch cannot run in place, or a storage is f16/bf16 (their rounding back from f64 is the
        host path's)."""
        if not self.in_place(executor) or any(s.dtype in ("f16", "bf16") for s in self.items):
            return None
        return {i: s.device_flat.to(_torch().float64) for i, s in enumerate(self.items) if s.dtype == "f32"}

    def narrow_back(self, widened: dict[int, Any], written: set[int]) -> None:
        """Rounds the f64 results of `widened` storages the launch wrote back into them."""
        for i in written:
            if i in widened:
                self.items[i].device_flat.copy_(widened[i])

    def specs(self, in_place: bool = False, widened: dict[int, Any] | None = None) -> list[tuple[str, str, int, int]]:
        """(names, dtype, address, elements) of each storage: device addresses where `in_place`
        (those of the f64 copies of `widened` storages), else host ones (host copies of CUDA
        storages)."""
        out = []
        for i, s in enumerate(self.items):
            names = "/".join(dict.fromkeys(s.names))
            if widened and i in widened:
                out.append((names, "f64", widened[i].data_ptr(), s.numel))
            else:
                out.append((names, s.dtype, s.addr if in_place else s.host_addr(), s.numel))
        return out

    def write_back(self, written: set[int]) -> None:
        """Copies host results of device storages back to the device."""
        for i in written:
            s = self.items[i]
            if s.device_flat is not None and s.flat is not None:
                s.device_flat.copy_(s.flat)
