"""pytest helpers: the `tilegrad` fixture, `assert_backward`/`assert_function`, and the
`nan_empty` fixture.

Installing tilegrad registers this module as a pytest plugin. Its `tilegrad` fixture checks and
asserts, with the backend and seed given on pytest's command line, so that one suite runs on the
CPU reference (the default) or on a GPU without code changes:

```python
def test_rms_norm_backward(tilegrad):
    x, w = torch.randn(64, 300), torch.randn(300)
    tilegrad.check_function(RMSNormFunction, x, w)
```

    pytest                                            # CPU reference, seed 0
    pytest --tilegrad-backend gpu --tilegrad-seed 3   # a CUDA GPU, cotangents of seed 3

A failing check raises `AssertionError` whose first line is the verdict (`tilegrad: grad_w of
RMSNormFunction FAILS: 300/300 over tolerance, worst [187]: ...`), followed by the report's table:
which gradient is wrong, its worst element and the kernel line that wrote it. tilegrad's own
frames are hidden from the traceback. Checks keep no state between tests and write no temporary
files (the GPU backend's disk cache of compiled kernels is safe to share), so a suite runs under
pytest-xdist (`pytest -n auto`).
"""

from __future__ import annotations

from typing import Any, Callable

from . import check_backward, check_function
from ._report import Report

__all__ = ["Checker", "assert_backward", "assert_function"]


def assert_backward(forward: Callable[..., Any], backward: Callable[..., Any], inputs: Any, **options: Any) -> Report:
    """`check_backward(...)` that raises AssertionError (the verdict, then the table) unless it
    passes."""
    __tracebackhide__ = True
    report = check_backward(forward, backward, inputs, **options)
    report.assert_passes()
    return report


def assert_function(fn: type, *args: Any, **options: Any) -> Report:
    """`check_function(...)` that raises AssertionError (the verdict, then the table) unless it
    passes."""
    __tracebackhide__ = True
    report = check_function(fn, *args, **options)
    report.assert_passes()
    return report


class Checker:
    """What the `tilegrad` fixture gives a test: `check_backward` and `check_function` that run
    on `backend` with cotangents of `seed` (pytest's `--tilegrad-backend` and `--tilegrad-seed`;
    an option passed to a call wins) and raise AssertionError unless the check passes. Both
    return the report."""

    def __init__(self, backend: str = "cpu", seed: int = 0) -> None:
        self.backend = backend
        self.seed = seed

    def check_backward(self, forward: Callable[..., Any], backward: Callable[..., Any], inputs: Any, **options: Any) -> Report:
        """`tilegrad.check_backward(forward, backward, inputs, **options)`, asserted."""
        __tracebackhide__ = True
        return assert_backward(forward, backward, inputs, **self._options(options))

    def check_function(self, fn: type, *args: Any, **kwargs: Any) -> Report:
        """`tilegrad.check_function(fn, *args, **kwargs)`, asserted."""
        __tracebackhide__ = True
        return assert_function(fn, *args, **self._options(kwargs))

    def _options(self, options: dict[str, Any]) -> dict[str, Any]:
        return {"backend": self.backend, "seed": self.seed, **options}

    def __repr__(self) -> str:
        return f"<tilegrad checker: backend {self.backend!r}, seed {self.seed}>"


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pytest = None

if pytest is not None:

    def pytest_addoption(parser: Any) -> None:
        group = parser.getgroup("tilegrad", "tilegrad gradient checks (the `tilegrad` fixture)")
        group.addoption(
            "--tilegrad-backend",
            choices=("cpu", "gpu", "auto", "triton"),
            default="cpu",
            help="where the `tilegrad` fixture's checks run their kernel launches: cpu (the reference, default), gpu, auto, "
            "or triton (Triton itself, cross-checked against tilegrad's GPU backend)",
        )
        group.addoption("--tilegrad-seed", type=int, default=0, help="the seed of the `tilegrad` fixture's random cotangents (default 0)")

    def pytest_report_header(config: Any) -> str | None:
        backend, seed = config.getoption("tilegrad_backend"), config.getoption("tilegrad_seed")
        if (backend, seed) == ("cpu", 0):
            return None
        return f"tilegrad: backend {backend}, seed {seed}"

    @pytest.fixture
    def tilegrad(request: Any) -> Checker:
        """Checks that assert, on pytest's `--tilegrad-backend` with `--tilegrad-seed`."""
        return Checker(request.config.getoption("tilegrad_backend"), request.config.getoption("tilegrad_seed"))

    @pytest.fixture
    def nan_empty():
        """Inside the test, `torch.empty*` float allocations start as NaN (with torch installed)."""
        try:
            from ._modes import PoisonEmpty
        except ImportError:
            yield None
            return
        mode = PoisonEmpty()
        with mode:
            yield mode
