"""Checks of kernels under `@triton.autotune`: on one config, or on each in turn."""

from __future__ import annotations

from typing import Callable

from ._report import Report


def each_config(autotune: int | str, name: str, run: Callable[[str], Report]) -> Report:
    """Runs a check with `@triton.autotune` kernels on config `autotune` (an index), or on each
    config in turn (`"all"`: run k uses config k of every autotuned kernel, wrapping around for
    kernels with fewer); returns the first failing report (its name says the config), else the
    last."""
    from . import _intercept

    saved = (_intercept.autotune_config, _intercept.autotune_wrap, _intercept.autotune_seen)
    try:
        if autotune != "all":
            if not isinstance(autotune, int) or isinstance(autotune, bool):
                raise ValueError(f"autotune must be a config index or 'all', not {autotune!r}")
            _intercept.autotune_config, _intercept.autotune_wrap = autotune, False
            return run(name)
        _intercept.autotune_wrap, _intercept.autotune_seen = True, 0
        k = 0
        while True:
            _intercept.autotune_config = k
            report = run(name)
            if _intercept.autotune_seen > 1:
                report = report.renamed(f"{name} [autotune config {k}]")
            if not report.passed or k + 1 >= _intercept.autotune_seen:
                return report
            k += 1
    finally:
        _intercept.autotune_config, _intercept.autotune_wrap, _intercept.autotune_seen = saved
