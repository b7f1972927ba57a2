"""Torch's intra-op threads, one during a check.

A check alternates many small torch ops (copies, f64 conversions, comparisons, the user's host
code) with the engine's own parallel work. Torch's OpenMP threads spin for a while after each op,
waiting for the next: on a machine whose cores are busy (the engine's threads, another process)
they take the cores the engine needs, and a check that takes 0.06 s with one torch thread takes
seconds. A check therefore runs torch single-threaded, and restores the caller's setting after;
except a check of large tensors (any of `LARGE` elements or more), whose host-side copies and
conversions of tens of millions of elements are worth torch's threads.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Sequence

# Elements of a tensor from which a check keeps torch's threads.
LARGE = 1 << 22


@contextlib.contextmanager
def one_torch_thread(args: Sequence[Any] = ()) -> Iterator[None]:
    """Inside the block, `torch.get_num_threads() == 1` unless a tensor of `args` has `LARGE`
    elements or more; the caller's count is restored after (whatever the block raises). Does
    nothing where torch has not been imported."""
    torch = sys.modules.get("torch")
    prev = torch.get_num_threads() if torch is not None else 1
    large = torch is not None and any(isinstance(a, torch.Tensor) and a.numel() >= LARGE for a in args)
    if prev == 1 or large:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
