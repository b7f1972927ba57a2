"""Torch's intra-op threads, one during a check.

A check alternates many small torch ops (copies, f64 conversions, comparisons, the user's host
code) with the engine's own parallel work. Torch's OpenMP threads spin for a while after each op,
waiting for the next: on a machine whose cores are busy (the engine's threads, another process)
they take the cores the engine needs, and a check that takes 0.06 s with one torch thread takes
seconds. A check therefore runs torch single-threaded, and restores the caller's setting after.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Inside the block, `torch.get_num_threads() == 1`; the caller's count is restored after
    (whatever the block raises). Does nothing where torch has not been imported."""
    torch = sys.modules.get("torch")
    prev = torch.get_num_threads() if torch is not None else 1
    if prev == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
