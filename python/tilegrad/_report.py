"""The report of a check: the CLI's table and JSON."""

from __future__ import annotations

import json
from typing import Any

from . import _native


class NonFiniteError(_native.UsageError):
    """An input, the ground truth's forward or its gradient is NaN or infinite: against a
    non-finite ground truth a check cannot tell a right backward from a wrong one (pass
    `allow_non_finite=True` to check anyway)."""


def non_finite(what: str, value: float, index: list[int], why: str) -> NonFiniteError:
    v = "NaN" if value != value else repr(value)
    return NonFiniteError(
        f"{what} is {v} at {index}: {why}; a check against a non-finite ground truth cannot tell a right backward "
        "from a wrong one (allow it with `allow_non_finite=True`)"
    )


class Report:
    """The outcome of a check.

    `passed` is True when every forward output and gradient is within tolerance and the backward
    ran cleanly; `str(report)` is the CLI's table; `to_dict()` the CLI's `--json` data.
    """

    def __init__(self, native: Any) -> None:
        self._native = native

    @property
    def passed(self) -> bool:
        return self._native.passed

    @property
    def notes(self) -> list[dict]:
        """What the kernels rely on that Triton does not promise, though its GPU backends do it
        (masked-off lanes read as 0; programs storing the same value to one element), as the
        JSON's `notes`: not failures unless the check was strict."""
        return self.to_dict().get("notes", [])

    def to_dict(self) -> dict:
        return json.loads(self._native.to_json())

    def to_json(self) -> str:
        return self._native.to_json()

    def assert_passes(self) -> None:
        """Raises AssertionError carrying the table when the check failed."""
        if not self.passed:
            raise AssertionError("\n" + str(self))

    def __bool__(self) -> bool:
        return self.passed

    def __str__(self) -> str:
        return str(self._native)

    def __repr__(self) -> str:
        return f"<tilegrad.Report {'PASS' if self.passed else 'FAIL'}>"
