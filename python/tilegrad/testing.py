"""pytest helpers: `assert_backward` and the `nan_empty` fixture.

```python
from tilegrad.testing import assert_backward

def test_my_backward():
    x = torch.randn(1000, 300)
    assert_backward(my_forward, my_backward, [x])
```

A failing check raises `AssertionError` carrying the report's table, so pytest shows which
gradient is wrong, its worst element and the kernel line that wrote it.
"""

from __future__ import annotations

from typing import Any, Callable

from . import check_backward, check_function
from ._report import Report


def assert_backward(forward: Callable[..., Any], backward: Callable[..., Any], inputs: Any, **options: Any) -> Report:
    """`check_backward(...)` that raises AssertionError with the table unless it passes."""
    report = check_backward(forward, backward, inputs, **options)
    report.assert_passes()
    return report


def assert_function(fn: type, *args: Any, **options: Any) -> Report:
    """`check_function(...)` that raises AssertionError with the table unless it passes."""
    report = check_function(fn, *args, **options)
    report.assert_passes()
    return report


try:
    import pytest
except ImportError:  # pragma: no cover - pytest is optional
    pytest = None

if pytest is not None:

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
