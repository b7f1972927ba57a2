"""The report of a check: the CLI's table and JSON."""

from __future__ import annotations

import json
from typing import Any


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
