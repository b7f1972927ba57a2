"""Shared setup of the tilegrad package's tests: the tests that need torch or triton skip where
they are not installed; the numpy-only tests always run.

`TILEGRAD_TEST_REQUIRE` (module names separated by spaces or commas, as CI sets it: `torch
triton xdist`) turns a skip for want of one of those modules into a failure, so that a run that
must test everything cannot pass by skipping it."""

import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

REQUIRED = [m for m in os.environ.get("TILEGRAD_TEST_REQUIRE", "").replace(",", " ").split() if m]


def _missing_required(report) -> str | None:
    """The required module whose absence skipped `report`'s test or module, if one did."""
    if not (REQUIRED and report.skipped):
        return None
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return next((m for m in REQUIRED if f"could not import '{m}'" in reason or f"could not import '{m}." in reason), None)


def _fail(report, module: str) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"{reason}\n`{module}` is required here (TILEGRAD_TEST_REQUIRE): install it rather than skip its tests"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    module = _missing_required(report)
    if module:
        _fail(report, module)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    module = _missing_required(report)
    if module:
        _fail(report, module)
