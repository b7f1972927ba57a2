"""numpy-only operation: launches on numpy arrays (views, offsets, aliasing), the ground-truth
VJP of launches, and check_backward, with torch blocked from importing (so these tests hold on a
machine without torch). Triton is needed for `@triton.jit` to exist."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import pathlib

import numpy as np
import pytest

pytest.importorskip("triton")

HERE = pathlib.Path(__file__).resolve().parent

# Runs a script in a fresh interpreter in which `import torch` fails.
PRELUDE = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None  # import torch raises ImportError
    sys.path.insert(0, %r)
    import numpy as np
    import triton
    import tilegrad
    import kernels as K
    """
    % str(HERE)
)


def run_without_torch(body: str) -> str:
    code = PRELUDE + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_launch_on_numpy_views_without_torch():
    out = run_without_torch(
        """
        rng = np.random.default_rng(0)
        buf = rng.standard_normal(300).astype(np.float32)
        x = buf[100:]            # a view with an element offset
        y = np.empty(200, np.float32)
        with tilegrad.intercept():
            K.square[(4,)](x, y, 200, BLOCK=64)
        assert np.array_equal(y, x * x)
        acc = rng.standard_normal(130)
        inc = rng.standard_normal(130)
        expect = acc + 2 * inc
        with tilegrad.intercept():
            K.add_into[(3,)](acc, inc, 130, BLOCK=64)
            K.add_into[(3,)](acc, inc, 130, BLOCK=64)
        assert np.allclose(acc, expect, rtol=0, atol=1e-12)
        try:
            with tilegrad.intercept():
                K.square[(1,)](buf[280:], np.empty(64, np.float32), 64, BLOCK=64)
        except tilegrad.LaunchError as e:
            assert "out-of-bounds" in str(e).lower() and "x_ptr" in str(e)
            print("oob ok")
        """
    )
    assert "oob ok" in out


def test_vjp_and_check_backward_without_torch():
    out = run_without_torch(
        """
        rng = np.random.default_rng(1)
        x = rng.standard_normal(1000).astype(np.float32)

        def square(x):
            y = np.empty_like(x)
            K.square[(16,)](x, y, x.size, BLOCK=64)
            return y

        def square_bwd(x, gy, kernel=K.square_bwd):
            gx = np.empty_like(x)
            kernel[(16,)](x, gy, gx, x.size, BLOCK=64)
            return (gx,)

        c = rng.standard_normal(1000)
        (g,) = tilegrad.vjp(square, [x], [c])
        assert g.dtype == np.float64
        assert np.allclose(g, 2 * x.astype(np.float64) * c, rtol=0, atol=1e-12)

        r = tilegrad.check_backward(square, square_bwd, [x])
        assert r.passed, str(r)
        print(r)
        r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x])
        assert not r.passed
        assert "kernels.py:30:" in str(r), str(r)
        r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_unmasked), [x])
        assert not r.passed and "out-of-bounds" in r.to_dict()["failure"]["message"].lower()

        def partial(x, gy):
            gx = np.empty_like(x)
            K.square_bwd[(15,)](x, gy, gx, 960, BLOCK=64)  # the last 40 elements never written
            return (gx,)

        r = tilegrad.check_backward(square, partial, [x])
        assert not r.passed and r.to_dict()["gradients"][0]["nan"] == 40, str(r)
        print("numpy checks ok")
        """
    )
    assert "numpy checks ok" in out and "PASS" in out


def test_notes_of_code_as_it_runs_on_a_gpu_without_torch():
    out = run_without_torch(
        """
        rng = np.random.default_rng(2)
        x = rng.standard_normal((37, 300)).astype(np.float32)

        def row_sum(x):
            out = np.empty(x.shape[0], np.float32)
            K.row_sum_tail[(x.shape[0],)](x, out, x.shape[1], BLOCK=512)
            return out

        def row_sum_bwd(x, g):
            gx = np.empty_like(x)
            K.row_broadcast[(x.shape[0],)](g, gx, x.shape[1], BLOCK=512)
            return (gx,)

        # The masked-off lanes read 0, as on the GPU: the sums are right.
        with tilegrad.intercept():
            sums = row_sum(x)
        assert np.allclose(sums, x.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
        r = tilegrad.check_backward(row_sum, row_sum_bwd, [x])
        assert r.passed, str(r)
        notes = r.notes
        assert [(n["kind"], n["pass"]) for n in notes] == [("masked_lanes", "forward")], notes
        assert notes[0]["locations"][0]["file"].endswith("kernels.py"), notes
        assert "reads masked-off lanes" in str(r), str(r)
        strict = tilegrad.check_backward(row_sum, row_sum_bwd, [x], strict=True)
        assert not strict.passed and any(f["kind"] == "masked_lanes" for f in strict.to_dict()["findings"]), str(strict)
        print("notes ok")
        """
    )
    assert "notes ok" in out


def test_numpy_inputs_in_process():
    # Without forcing torch out: numpy inputs take the numpy path whether or not torch is there.
    import kernels as K
    import tilegrad

    x = np.random.default_rng(2).standard_normal(333).astype(np.float32)

    def square(x):
        y = np.empty_like(x)
        K.square[(6,)](x, y, x.size, BLOCK=64)
        return y

    def bwd(x, gy):
        gx = np.empty_like(x)
        K.square_bwd[(6,)](x, gy, gx, x.size, BLOCK=64)
        return (gx,)

    tilegrad.check_backward(square, bwd, [x]).assert_passes()


def test_trust_rules_and_constexprs_without_torch():
    out = run_without_torch(
        """
        import kernels_surface as S
        rng = np.random.default_rng(1)
        N = 1000

        def act(eps):
            def fwd(x, b):
                y = np.empty_like(x)
                S.scaled_act[(8,)](x, b, y, N, eps=1e-3, ACT="leaky_relu", reduction="mean", OUT=triton.language.float32, BLOCK=128)
                return y

            def bwd(x, b, gy):
                gx = np.empty_like(x)
                S.scaled_act_bwd[(8,)](x, b, gy, gx, N, eps=eps, ACT="leaky_relu", reduction="mean", BLOCK=128)
                return gx, gx.copy()

            return fwd, bwd

        x = rng.standard_normal(N).astype(np.float32)
        b = rng.standard_normal(N).astype(np.float32)
        assert tilegrad.check_backward(*act(1e-3), [x, b]).passed
        assert not tilegrad.check_backward(*act(0.05), [x, b]).passed

        # A NaN input is an error naming it, unless allowed.
        bad = x.copy(); bad[7] = np.nan
        try:
            tilegrad.check_backward(*act(1e-3), [bad, b])
            raise SystemExit("no error")
        except tilegrad.NonFiniteError as e:
            assert "input `x` is NaN at [7]" in str(e), e
        tilegrad.check_backward(*act(1e-3), [bad, b], allow_non_finite=True)

        # f16 gradients: calibrated to the kernels' rounding noise.
        def scale(x):
            y = np.empty_like(x)
            S.scale[(24,)](x, y, x.size, 1.7, BLOCK=128)
            return y

        def scale_bwd(skew):
            def bwd(x, gy):
                gx = np.empty_like(x)
                S.scale_bwd_f16[(24,)](gy, gx, x.size, 1.7, skew, BLOCK=128)
                return (gx,)
            return bwd

        h = rng.standard_normal(3001).astype(np.float16)
        good = tilegrad.check_backward(scale, scale_bwd(1.0), [h])
        assert good.passed and good.to_dict()["gradients"][0]["calibration"] is not None, str(good)
        skewed = tilegrad.check_backward(scale, scale_bwd(1.003), [h])
        assert not skewed.passed and skewed.to_dict()["gradients"][0]["over_tolerance"] == 0, str(skewed)
        print("ok")
        """
    )
    assert out.strip().endswith("ok")


def test_backends_without_torch():
    # `backend=`: the CLI's choices. Without a usable GPU, "gpu" is a UsageError saying why and
    # "auto" runs on the CPU; with one, the launches run there with the same verdicts.
    out = run_without_torch(
        """
        rng = np.random.default_rng(3)
        x = rng.standard_normal(777).astype(np.float32)

        def square(x):
            y = np.empty_like(x)
            K.square[(13,)](x, y, x.size, BLOCK=64)
            return y

        def square_bwd(x, gy, kernel=K.square_bwd, grid=13):
            gx = np.empty_like(x)
            kernel[(grid,)](x, gy, gx, x.size, BLOCK=64)
            return (gx,)

        try:
            tilegrad.check_backward(square, square_bwd, [x], backend="tpu")
            raise SystemExit("an unknown backend was accepted")
        except tilegrad.UsageError as e:
            assert "backend `tpu`" in str(e), str(e)
        try:
            gpu = tilegrad._native.Executor("gpu")
        except tilegrad.UsageError as e:
            gpu = None
            assert "GPU" in str(e), str(e)
        backends = ["cpu", "auto"] + (["gpu", "compare"] if gpu is not None else [])
        for b in backends:
            r = tilegrad.check_backward(square, square_bwd, [x], backend=b)
            assert r.passed, str(r)
            on_gpu = r.to_dict()["backend"].startswith("gpu")
            assert on_gpu == (gpu is not None and b != "cpu"), (b, r.to_dict()["backend"])
            assert r.to_dict().get("backend_mismatches", []) == [], str(r)
            # The same failures, found wherever the launches ran.
            r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_unmasked), [x], backend=b)
            assert not r.passed and "out-of-bounds" in r.to_dict()["failure"]["message"].lower(), str(r)
            r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, grid=12), [x], backend=b)
            assert not r.passed and r.to_dict()["gradients"][0]["nan"] == 777 - 12 * 64, str(r)
            with tilegrad.intercept(backend=b) as ex:
                y = square(x)
            assert np.array_equal(y, x * x)
            assert ex.describe().startswith("gpu") == on_gpu, ex.describe()
        print("backends ok:", ", ".join(backends))
        """
    )
    print(out)
    assert "backends ok" in out


def test_vjp_kernels_from_python_without_torch():
    out = run_without_torch(
        """
        rng = np.random.default_rng(2)
        rows, cols = 7, 100
        x = rng.standard_normal((rows, cols)).astype(np.float32)

        def f(x):
            out = np.empty(rows, np.float32)
            total = np.zeros(1, np.float32)
            K.row_max_sum[(rows,)](x, out, total, cols, BLOCK=32)
            return out, total

        cots = [rng.standard_normal(rows), rng.standard_normal(1)]
        (want,) = tilegrad.vjp(f, [x], cots)
        (got,) = tilegrad.vjp(f, [x], cots, ground="kernels")
        # Independently: each lane's max over the row's column blocks gets c_out[r] + c_total.
        ref = np.zeros((rows, cols))
        for r in range(rows):
            for lane in range(32):
                cs = list(range(lane, cols, 32))
                j = max(cs, key=lambda c: (x[r, c], -c))
                ref[r, j] += cots[0][r] + cots[1][0]
        assert np.count_nonzero(ref) > rows
        assert np.allclose(want, ref, rtol=0, atol=1e-12), (want - ref)
        assert np.allclose(got, ref, rtol=0, atol=1e-12), (got - ref)
        (native,) = tilegrad.vjp(f, [x], cots, precision="native", ground="kernels")
        assert np.allclose(native, ref, rtol=1e-6, atol=1e-6)
        try:
            tilegrad.vjp(f, [x], cots, ground="kernel")
        except tilegrad.UsageError as e:
            assert "expected" in str(e) and "kernels" in str(e)
            print("bad ground ok")
        print("vjp kernels ok")
        """
    )
    assert "vjp kernels ok" in out and "bad ground ok" in out
