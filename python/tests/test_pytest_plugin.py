"""tilegrad under pytest, as a user's suite runs it (pytest in a subprocess, with the plugin that
installing the package registers): a failing check's message starts with the verdict and its
traceback shows the user's frames only; `--tilegrad-backend`/`--tilegrad-seed` reach the
`tilegrad` fixture; a suite of checks runs under pytest-xdist with the same verdicts and no files
left behind. Also: `Report.summary()` and the report table's width."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import kernels as K  # noqa: E402
import tilegrad  # noqa: E402
from test_torch_api import square, square_bwd  # noqa: E402

TESTS = pathlib.Path(__file__).resolve().parent
PACKAGE = pathlib.Path(tilegrad.__file__).resolve().parents[1]

SUITE = '''
import os

import pytest
import torch
import triton

import kernels as K


def square(x):
    y = torch.empty_like(x)
    K.square[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


def square_bwd(x, gy, kernel=K.square_bwd):
    gx = torch.empty_like(x)
    kernel[(triton.cdiv(x.numel(), 64),)](x, gy, gx, x.numel(), BLOCK=64)
    return (gx,)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return square(x)

    @staticmethod
    def backward(ctx, gy):
        (x,) = ctx.saved_tensors
        return square_bwd(x, gy)[0]


@pytest.mark.parametrize("n", [1, 63, 64, 65, 100, 777, 1000, 4096])
def test_square(tilegrad, n):
    if os.environ.get("EXPECT_XDIST"):
        assert os.environ["PYTEST_XDIST_WORKER"].startswith("gw")
    r = tilegrad.check_backward(square, square_bwd, [torch.randn(n)])
    d = r.to_dict()
    assert (d["seed"], d["backend"]) == (int(os.environ["EXPECT_SEED"]), "cpu")
    assert (tilegrad.seed, tilegrad.backend) == (int(os.environ["EXPECT_SEED"]), "cpu")


@pytest.mark.parametrize("n", [10, 500, 3000])
def test_square_function(tilegrad, n):
    tilegrad.check_function(Square, torch.randn(n))


def test_wrong_backward(tilegrad):
    x = torch.randn(300, generator=torch.Generator().manual_seed(0)) + 3
    tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x])
'''


def run_pytest(tmp_path: pathlib.Path, *args: str, seed: int = 0, xdist: bool = False) -> subprocess.CompletedProcess:
    """pytest on the suite above in a fresh directory, with only the plugins named (the tilegrad
    plugin as its entry point names it), the package under test first on the path, and an empty
    temporary directory of its own."""
    (tmp_path / "test_suite.py").write_text(SUITE)
    temp = tmp_path / "temp"
    temp.mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(PACKAGE), str(TESTS), env.get("PYTHONPATH", "")]),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        EXPECT_SEED=str(seed),
        EXPECT_XDIST="1" if xdist else "",
        COLUMNS="300",
        TMPDIR=str(temp),
        TILEGRAD_CACHE_DIR=str(tmp_path / "cache"),
    )
    env.pop("PYTEST_ADDOPTS", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "tilegrad.testing", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}", "-rf", "-q", *args, "test_suite.py"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_a_failing_check_says_its_verdict_first_and_the_options_reach_the_fixture(tmp_path):
    p = run_pytest(tmp_path, "--tb=long", "--tilegrad-seed", "5", "--tilegrad-backend", "cpu", seed=5)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "11 passed" in out and "1 failed" in out, out
    # The short summary line: the verdict, not `AssertionEr...` of a message starting with "\n".
    summary = re.search(r"^FAILED test_suite.py::test_wrong_backward - (.*)$", out, re.M)
    assert summary, out
    assert summary.group(1).startswith("AssertionError: tilegrad: grad_x of square FAILS: 300/300 over tolerance, worst ["), out
    assert "written at kernels.py:30, kernel `square_bwd_wrong`" in summary.group(1), out
    # The traceback: the user's test, then the message; no frame of tilegrad's own files.
    assert "def test_wrong_backward(tilegrad):" in out, out
    frames = re.findall(r"^(\S+\.py):\d+: ", out, re.M)
    assert frames and all(f.endswith("test_suite.py") for f in frames), frames
    assert "E       AssertionError: tilegrad: grad_x of square FAILS" in out, out
    assert "E       check `square`: FAIL (seed 5," in out, out


def test_the_plugins_options_are_documented_and_checked(tmp_path):
    p = run_pytest(tmp_path, "--tilegrad-backend", "tpu")
    assert p.returncode == 4 and "invalid choice: 'tpu'" in p.stderr, p.stdout + p.stderr
    p = run_pytest(tmp_path, "--help")
    assert "--tilegrad-backend" in p.stdout and "--tilegrad-seed" in p.stdout, p.stdout
    p = run_pytest(tmp_path, "--tilegrad-seed", "3", "--collect-only", "-v")  # -q -v: the header shows
    assert p.returncode == 0 and "tilegrad: backend cpu, seed 3" in p.stdout, p.stdout
    p = run_pytest(tmp_path, "--collect-only", "-v")
    assert p.returncode == 0 and "tilegrad: backend" not in p.stdout, p.stdout


def test_a_suite_runs_under_xdist_with_the_verdicts_of_one_process(tmp_path):
    pytest.importorskip("xdist")
    p = run_pytest(tmp_path, "-p", "xdist.plugin", "-n", "2", "--tilegrad-seed", "2", seed=2, xdist=True)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "11 passed" in out and "1 failed" in out, out
    assert re.search(r"^FAILED test_suite.py::test_wrong_backward - AssertionError: tilegrad: grad_x of square FAILS", out, re.M), out
    # Nothing written to the temporary directory or the kernel cache.
    assert list((tmp_path / "temp").iterdir()) == [], list((tmp_path / "temp").iterdir())
    assert not (tmp_path / "cache").exists()


def test_summary_names_the_gradient_the_count_the_worst_element_and_the_line():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    good = tilegrad.check_backward(square, square_bwd, [x])
    assert good.summary() == "tilegrad: square PASSES (1 gradient within tolerance)"
    bad = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x], name="Square")
    s = bad.summary()
    assert re.fullmatch(
        r"tilegrad: grad_x of Square FAILS: \d+/1000 over tolerance, worst \[\d+\]: expected \S+, got \S+ "
        r"\(written at kernels\.py:30, kernel `square_bwd_wrong`\)",
        s,
    ), s
    with pytest.raises(AssertionError) as e:
        bad.assert_passes()
    assert str(e.value).splitlines()[0] == s and str(e.value).splitlines()[1].startswith("check `Square`: FAIL")
    # A failure that is not a wrong value: its message's first line.
    oob = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_unmasked), [x], name="Square")
    assert oob.summary().startswith("tilegrad: Square FAILS: ") and "out-of-bounds" in oob.summary().lower(), oob.summary()


def test_the_report_table_fits_100_columns():
    x = torch.randn(1000, 300)
    r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x])
    lines = str(r).splitlines()
    # Lines quoting the user's source (blame, data flow) are as long as that source.
    table = [line for line in lines if not line.lstrip().startswith(("written by", "via", "value computed", "never written")) and " | " not in line]
    assert all(len(line) <= 100 for line in table), "\n".join(line for line in table if len(line) > 100)
    header = next(line for line in lines if line.lstrip().startswith("input"))
    assert header.split() == ["input", "tensor", "shape", "dtype", "max", "abs", "max", "rel", "norm", "rel", "over", "tol", "nan/inf", "rtol", "atol", "result"]


def test_required_modules_fail_instead_of_skipping(tmp_path):
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_needs.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_needs_a_module():
                pytest.importorskip("tilegrad_no_such_module")
            """
        )
    )
    (tmp_path / "test_needs_at_import.py").write_text('import pytest\npytest.importorskip("tilegrad_no_such_module")\n')
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA"]
    skipped = subprocess.run(cmd, cwd=tmp_path, env={**env, "TILEGRAD_TEST_REQUIRE": ""}, capture_output=True, text=True, timeout=300)
    assert skipped.returncode == 0 and "2 skipped" in skipped.stdout, skipped.stdout
    env["TILEGRAD_TEST_REQUIRE"] = "numpy tilegrad_no_such_module"
    for test, outcome in (("test_needs.py", "1 failed"), ("test_needs_at_import.py", "1 error")):
        required = subprocess.run([*cmd, test], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        out = required.stdout
        assert required.returncode in (1, 2) and outcome in out, out
        assert "`tilegrad_no_such_module` is required here (TILEGRAD_TEST_REQUIRE)" in out, out
