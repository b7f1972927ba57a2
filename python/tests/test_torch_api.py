"""check_backward on plain functions with torch: host code between launches, views and strides,
aliasing (in-place kernels), out-of-bounds naming the argument, heuristics and autotune wrappers,
the Report API, the pytest helper and `tilegrad.autograd`."""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import kernels as K  # noqa: E402
import tilegrad  # noqa: E402
from tilegrad.testing import assert_backward  # noqa: E402


def grid1(n, b=64):
    return (triton.cdiv(n, b),)


def square(x):
    y = torch.empty_like(x)
    K.square[grid1(x.numel())](x, y, x.numel(), BLOCK=64)
    return y


def square_bwd(x, gy, kernel=K.square_bwd):
    gx = torch.empty_like(x)
    kernel[grid1(x.numel())](x, gy, gx, x.numel(), BLOCK=64)
    return (gx,)


def test_square_passes_and_reports_like_the_cli():
    x = torch.randn(1000)
    r = tilegrad.check_backward(square, square_bwd, [x])
    assert r.passed, str(r)
    text = str(r)
    assert text.startswith("check `square`: PASS (seed 0, 2 cotangent trials, ground truth f64)")
    assert re.search(r"^  x +grad_x +\[1000\] +f32 .* 1e-4 1e-5 +ok$", text, re.M), text  # rtol, atol
    d = r.to_dict()
    assert d["passed"] and d["trials"] == 2 and d["precision"] == "f64"
    assert d["gradients"][0]["shape"] == [1000] and d["gradients"][0]["dtype"] == "f32"
    r.assert_passes()


def test_wrong_gradient_fails_with_worst_element_and_line():
    x = torch.randn(1000)
    r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x])
    assert not r.passed
    text = str(r)
    assert "FAIL" in text and "worst element" in text
    assert "kernels.py:30:" in text, text  # the store of square_bwd_wrong
    with pytest.raises(AssertionError) as e:
        r.assert_passes()
    assert "worst element" in str(e.value)


def test_out_of_bounds_in_backward_is_a_verdict_naming_the_argument():
    x = torch.randn(1000)
    r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_unmasked), [x])
    assert not r.passed
    f = r.to_dict()["failure"]
    assert "out-of-bounds" in f["message"].lower() and "kernels.py:39:" in f["message"], f
    assert "gx_ptr" in f["message"], f


def test_host_code_between_launches_is_differentiated():
    # out = sum(square(x * 3 + w)) computed partly on the host: the ground truth goes through it.
    def forward(x, w):
        h = x * 3.0 + w
        y = square(h)
        return y.sum() * 0.5

    def backward(x, w, g):
        h = x * 3.0 + w
        (gh,) = square_bwd(h, (g * 0.5).expand_as(h).contiguous())
        return gh * 3.0, gh

    x, w = torch.randn(777), torch.randn(777)
    assert_backward(forward, backward, [x, w])

    def backward_wrong(x, w, g):
        gx, gw = backward(x, w, g)
        return gx, gw * 2

    r = tilegrad.check_backward(forward, backward_wrong, [x, w])
    assert not r.passed
    bad = [g["name"] for g in r.to_dict()["gradients"] if not g["passed"]]
    assert bad == ["w"]


def test_views_strides_and_storage_offsets():
    base = torch.randn(40, 70)
    xt = base.t()[5:60, 3:30]  # transposed, offset, non-contiguous view of a larger storage

    def forward(x):
        y = torch.empty(x.shape[0], x.shape[1] * 2)[:, ::2]  # strided output view
        K.scale_rows[(x.shape[0],)](x, y, x.shape[0], x.shape[1], *x.stride(), *y.stride(), 2.5, BLOCK=32)
        return y

    def backward(x, gy):
        gx = torch.empty(x.shape[1], x.shape[0]).t()
        K.scale_rows[(x.shape[0],)](gy, gx, x.shape[0], x.shape[1], *gy.stride(), *gx.stride(), 2.5, BLOCK=32)
        return (gx,)

    with tilegrad.intercept():
        assert forward(xt.clone()).shape == (55, 27)
    r = tilegrad.check_backward(forward, backward, [xt])
    assert r.passed, str(r)
    # The launch really ran on the views: compare with torch.
    with tilegrad.intercept():
        y = forward(xt)
    torch.testing.assert_close(y, 2.5 * xt)


def test_aliasing_in_place_kernel():
    # acc = x; acc += y twice through one storage (in place); out = acc * acc.
    def forward(x, y):
        acc = x.clone()
        K.add_into[grid1(x.numel())](acc, y, x.numel(), BLOCK=64)
        K.add_into[grid1(x.numel())](acc, y, x.numel(), BLOCK=64)
        out = torch.empty_like(acc)
        K.mul[grid1(x.numel())](acc, acc, out, x.numel(), BLOCK=64)
        return out

    def backward(x, y, g):
        s = x + 2 * y
        return 2 * s * g, 4 * s * g

    x, y = torch.randn(300), torch.randn(300)
    with tilegrad.intercept():
        out = forward(x, y)
    torch.testing.assert_close(out, (x + 2 * y) ** 2)
    assert_backward(forward, backward, [x, y])
    r = tilegrad.check_backward(forward, lambda x, y, g: (2 * (x + 2 * y) * g, 2 * (x + 2 * y) * g), [x, y])
    assert not r.passed


def test_out_of_bounds_is_the_storage_not_the_view():
    # A view of the middle of a buffer: reading past the view but inside the storage is allowed
    # (as on a GPU); past the storage is out of bounds.
    buf = torch.randn(200)
    x = buf[50:100]
    y = torch.empty(60)
    with tilegrad.intercept():
        K.square[(1,)](x, y, 60, BLOCK=64)  # reads buf[50:110]: inside the storage
    torch.testing.assert_close(y, buf[50:110] ** 2)
    with pytest.raises(tilegrad.LaunchError) as e:
        with tilegrad.intercept():
            K.square[(1,)](buf[150:], torch.empty(64), 64, BLOCK=64)
    assert "x_ptr" in str(e.value) and "out-of-bounds" in str(e.value).lower()


def test_heuristics_and_autotune_wrappers():
    x = torch.randn(500)
    for k in (K.square_heuristic, K.square_autotuned):
        y = torch.empty_like(x)
        with tilegrad.intercept():
            k[lambda meta: (triton.cdiv(500, meta["BLOCK"]),)](x, y, 500)
        torch.testing.assert_close(y, x * x)
    with tilegrad.use_autotune_config(1), tilegrad.intercept():
        y = torch.empty_like(x)
        K.square_autotuned[lambda meta: (triton.cdiv(500, meta["BLOCK"]),)](x, y, 500)
    torch.testing.assert_close(y, x * x)


def test_autograd_gives_the_ground_truth_gradient():
    def f(x):
        return square(x).sum()

    x = torch.randn(300, dtype=torch.float32)
    xd = x.double().requires_grad_(True)
    out = tilegrad.autograd(f)(xd)
    assert out.dtype == torch.float64
    (g,) = torch.autograd.grad(out, xd)
    torch.testing.assert_close(g, 2 * x.double(), rtol=0, atol=1e-12)
    (g,) = tilegrad.vjp(f, [x], [torch.tensor(1.5)])
    torch.testing.assert_close(g, 3 * x.double(), rtol=0, atol=1e-12)


def test_f16_inputs_use_f16_tolerances():
    x = torch.randn(999).half()
    r = tilegrad.check_backward(square, square_bwd, [x])
    assert r.passed, str(r)
    assert r.to_dict()["gradients"][0]["dtype"] == "f16"
    assert re.search(r"^  x +grad_x +\[999\] +f16 .* 1e-2 1e-3 +ok$", str(r), re.M), str(r)  # rtol, atol


def test_never_written_elements_are_nan_and_blamed():
    def backward(x, gy):
        gx = torch.empty_like(x)
        n = x.numel() - 10  # the last 10 elements are never written
        K.square_bwd[grid1(n)](x, gy, gx, n, BLOCK=64)
        return (gx,)

    r = tilegrad.check_backward(square, backward, [torch.randn(500)])
    assert not r.passed
    g = r.to_dict()["gradients"][0]
    assert g["nan"] == 10
    assert "never written" in str(r) and "empty_like at" in str(r) and "test_torch_api.py" in str(r)


def test_options_are_validated():
    x = torch.randn(10)
    with pytest.raises(ValueError):
        tilegrad.check_backward(square, square_bwd, [x], trials=0)
    with pytest.raises(ValueError):
        tilegrad.check_backward(square, square_bwd, [x], precision="f32")
    with pytest.raises(ValueError):
        tilegrad.check_backward(square, square_bwd, [x.long()])


def test_seed_and_tolerances_are_honoured():
    x = torch.randn(100)
    r = tilegrad.check_backward(square, lambda x, gy: square_bwd(x, gy, K.square_bwd_wrong), [x], rtol=0.6, atol=0.6, seed=3, trials=1)
    # |x gy - 2 x gy| = |expected| / 2 is within rtol 0.6, so no element is over it; a tolerance
    # replaces the rounding verdict, not the formula's: the backward is not the derivative.
    d = r.to_dict()
    assert not r.passed and d["gradients"][0]["over_tolerance"] == 0 and d["gradients"][0]["formula_passed"] is False, str(r)
    assert d["seed"] == 3 and d["trials"] == 1
    assert math.isclose(d["gradients"][0]["tolerance"]["rtol"], 0.6)


def test_blame_falls_back_to_a_run_with_the_launches_writers_recorded(monkeypatch):
    # Where the recorded run cannot be followed (here: it is never made), the element's writer
    # comes from a run with only the launches' writers recorded (a passing check records none).
    from tilegrad import _blame

    monkeypatch.setattr(_blame, "explain", lambda again, flat, values: None)

    def backward(x, gy):
        return square_bwd(x, gy * 1.5)

    r = tilegrad.check_backward(square, backward, [torch.randn(300)])
    assert not r.passed
    blame = r.to_dict()["gradients"][0]["worst"]["blame"]
    assert blame and "square_bwd" in str(blame), blame


def _cumsum(x):
    # The example's chunked cumsum: each chunk adds the running total, read back from the previous
    # chunk's last output (a load, in a loop's branch, of what the loop stored: the forward keeps
    # its values on a tape for the VJP kernel).
    from launchers import load

    y = torch.empty_like(x)
    load("chunk_cumsum").chunk_cumsum_fwd[(x.shape[0],)](x, y, x.shape[1], BT=16)
    return y


def _cumsum_bwd(x, gy):
    return (gy.flip(1).cumsum(1).flip(1),)


def test_a_load_of_what_a_loop_stored_is_differentiated_by_its_vjp_kernel():
    x = torch.randn(5, 77)
    kernels = tilegrad.check_backward(_cumsum, _cumsum_bwd, [x], ground="kernels")
    evaluator = tilegrad.check_backward(_cumsum, _cumsum_bwd, [x], ground="evaluator")
    assert kernels.passed and evaluator.passed, f"{kernels}\n{evaluator}"
    assert not kernels.notes and not evaluator.notes, kernels.notes
    broken = tilegrad.check_backward(_cumsum, lambda x, gy: (gy.cumsum(1),), [x], ground="kernels")
    assert not broken.passed, str(broken)


def _row_norm(x):
    # A persistent kernel: 4 programs walk the rows, and each row's column chunks in a loop inside.
    from launchers import load

    norm = torch.empty(x.shape[0], dtype=x.dtype)
    load("row_norm_persistent").row_norm_persistent_fwd[(4,)](x, norm, x.shape[0], x.shape[1], NUM_PROGS=4, BLOCK=32)
    return norm


def test_loops_inside_a_loop_are_differentiated_by_their_vjp_kernel():
    x = torch.randn(9, 77)
    right = lambda x, g: (x * (g / x.norm(dim=1))[:, None],)  # noqa: E731
    kernels = tilegrad.check_backward(_row_norm, right, [x], ground="kernels")
    assert kernels.passed and not kernels.notes, f"{kernels}"
    broken = tilegrad.check_backward(_row_norm, lambda x, g: (x * g[:, None],), [x], ground="kernels")
    assert not broken.passed, str(broken)


def _row_sq_sum(x):
    # Its loop advances a pointer (`p += BLOCK`): its VJP kernel carries the offset.
    from launchers import load

    y = torch.empty(x.shape[0], dtype=x.dtype)
    load("row_sq_sum").row_sq_sum_fwd[(x.shape[0],)](x, y, x.shape[1], BLOCK=32)
    return y


def test_a_loop_that_advances_a_pointer_is_differentiated_by_its_vjp_kernel():
    x = torch.randn(9, 77)
    kernels = tilegrad.check_backward(_row_sq_sum, lambda x, g: (2 * x * g[:, None],), [x], ground="kernels")
    assert kernels.passed and not kernels.notes, f"{kernels}"
    broken = tilegrad.check_backward(_row_sq_sum, lambda x, g: (x * g[:, None],), [x], ground="kernels")
    assert not broken.passed, str(broken)


def _cube_root(x):
    # Newton's iteration in place: a `while` loop reads back what it stored (VJP kernels do not
    # take that yet).
    from launchers import load

    y = torch.empty_like(x)
    load("cube_root").cube_root_fwd[((x.numel() + 63) // 64,)](x, y, x.numel(), TOL=1e-6, BLOCK=64)
    return y


def test_a_refused_vjp_kernel_gives_the_evaluator_truth_with_a_note():
    x = torch.rand(300) * 3 + 0.5
    right = lambda x, g: (g / (3 * x.pow(2 / 3)),)  # noqa: E731
    kernels = tilegrad.check_backward(_cube_root, right, [x], ground="kernels")
    evaluator = tilegrad.check_backward(_cube_root, right, [x], ground="evaluator")
    assert kernels.passed and evaluator.passed, f"{kernels}\n{evaluator}"
    assert [n["kind"] for n in kernels.notes] == ["ground_by_evaluator"], kernels.notes
    assert "ground truth by the evaluator" in str(kernels) and "`load`" in kernels.notes[0]["message"], kernels.notes
    assert not evaluator.notes
    broken = tilegrad.check_backward(_cube_root, lambda x, g: (g / x.pow(2 / 3),), [x], ground="kernels")
    assert not broken.passed, str(broken)


def test_an_absurd_grid_is_refused_before_it_runs_as_the_cli_refuses_it():
    x = torch.randn(64)
    y = torch.empty_like(x)
    with pytest.raises(tilegrad.UsageError, match=r"kernel `square` on grid \[2147483647, 1, 1\].*max_programs="):
        with tilegrad.intercept():
            K.square[(2**31 - 1,)](x, y, x.numel(), BLOCK=64)
    # The limit is the caller's to set: 1000 programs refused under 999, run under 1000.
    with pytest.raises(tilegrad.UsageError, match="1000 programs"):
        with tilegrad.intercept(max_programs=999):
            K.square[(1000,)](x, y, x.numel(), BLOCK=64)
    with tilegrad.intercept(max_programs=1000):
        K.square[(1000,)](x, y, x.numel(), BLOCK=64)
    torch.testing.assert_close(y, x * x)
