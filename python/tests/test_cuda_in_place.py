"""CUDA tensors under the GPU backend are used where they live: launches run on torch's device
memory in place (the same primary context), with no host copy, and give the results and verdicts
the host path gives. Skipped where no CUDA device is usable."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language

import functions_liger_style as L  # noqa: E402
import tilegrad  # noqa: E402
from tilegrad import _memory  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@triton.jit
def _axpy(X, Y, OUT, a, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(X + offs, mask=m)
    y = tl.load(Y + offs, mask=m)
    tl.store(OUT + offs, a * x + y, mask=m)


@triton.jit
def _ticket(COUNTER, OUT, n, BLOCK: tl.constexpr):
    # The old value of an atomic: programs depend on each other's order (the reference runs it).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    old = tl.atomic_add(COUNTER + offs * 0, 1, mask=m)
    tl.store(OUT + offs, old, mask=m)


@triton.jit
def _overrun(X, OUT, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(OUT + offs, tl.load(X + offs, mask=offs < n), mask=offs < n + 3)


@pytest.fixture
def no_host_copies(monkeypatch):
    """Fails the test if a launch makes a host copy of a CUDA storage."""

    def refuse(self):
        raise AssertionError(f"a host copy of CUDA storage `{self.names[0]}`")

    monkeypatch.setattr(_memory.Storage, "host_addr", lambda self: self.addr if self.device_flat is None else refuse(self))


def test_launches_run_on_device_memory_in_place(no_host_copies):
    n = 10_007
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    out = torch.full((n + 5,), 7.0, device="cuda")
    with tilegrad.intercept(backend="gpu"):
        _axpy[(triton.cdiv(n, 256),)](x, y, out[2:], 1.5, n, BLOCK=256)
    torch.testing.assert_close(out[2 : n + 2], 1.5 * x + y, rtol=0, atol=0)
    # Elements outside the view's range are untouched.
    assert out[:2].eq(7.0).all() and out[n + 2 :].eq(7.0).all()
    # Half precision: 16-bit storages in place.
    xh, yh = x.half(), y.half()
    outh = torch.empty(n, device="cuda", dtype=torch.float16)
    with tilegrad.intercept(backend="gpu"):
        _axpy[(triton.cdiv(n, 256),)](xh, yh, outh, 0.5, n, BLOCK=256)
    want = (0.5 * xh.float() + yh.float()).half()
    torch.testing.assert_close(outh, want, rtol=0, atol=0)


def test_a_launch_the_reference_settles_goes_through_host_copies_and_back():
    n = 300
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = torch.empty(n, dtype=torch.int32, device="cuda")
    with tilegrad.intercept(backend="gpu"):
        _ticket[(triton.cdiv(n, 128),)](counter, out, n, BLOCK=128)
    assert counter.item() == n
    assert sorted(out.tolist()) == list(range(n))


def test_an_out_of_bounds_store_in_place_is_the_located_error():
    n = 1000
    x, out = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    with pytest.raises(tilegrad.LaunchError, match=r"out-of-bounds.*`OUT`"):
        with tilegrad.intercept(backend="gpu"):
            _overrun[(triton.cdiv(n, 128),)](x, out, n, BLOCK=128)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_check_function_on_cuda_tensors_gives_the_host_verdicts(dtype):
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(67, 300, device="cuda", generator=gen).to(dtype)
    w = (torch.rand(300, device="cuda", generator=gen) + 0.5).to(dtype)
    on_gpu = tilegrad.check_function(L.RMSNorm, x, w, backend="gpu", seed=5)
    on_cpu = tilegrad.check_function(L.RMSNorm, x.cpu(), w.cpu(), backend="cpu", seed=5)
    assert on_gpu.passed and on_cpu.passed, f"{on_gpu}\n{on_cpu}"
    g, c = on_gpu.to_dict()["gradients"], on_cpu.to_dict()["gradients"]
    assert [a["name"] for a in g] == [b["name"] for b in c] == ["X", "W"]
    # dX is the kernel's alone: the same on both. dW is summed by torch on the host side, in the
    # device's order on CUDA: equal up to its rounding.
    assert g[0]["max_abs_err"] == pytest.approx(c[0]["max_abs_err"], rel=1e-6, abs=1e-12), (g[0], c[0])
    assert g[1]["max_abs_err"] <= 4 * c[1]["max_abs_err"] + 1e-6 and c[1]["max_abs_err"] <= 4 * g[1]["max_abs_err"] + 1e-6, (g[1], c[1])
    bad = tilegrad.check_function(L.RMSNormScaledDW, x, w, backend="gpu", seed=5)
    assert not bad.passed, str(bad)
    assert "FAIL" in str(bad)


def test_a_float_input_not_differentiated_keeps_the_ground_truth_on_the_device(no_host_copies):
    # `w` is not differentiated: the ground truth's launches read it promoted to f64 too, so
    # that they run in place (it went through host copies, 100 times slower at training sizes).
    gen = torch.Generator(device="cuda").manual_seed(6)
    x = torch.randn(67, 300, device="cuda", generator=gen)
    w = torch.rand(300, device="cuda", generator=gen) + 0.5
    r = tilegrad.check_function(L.RMSNorm, x, w, backend="gpu", wrt=[0])
    assert r.passed and [g["name"] for g in r.to_dict()["gradients"]] == ["X"], str(r)
    bad = tilegrad.check_function(L.RMSNormNoMean, x, w, backend="gpu", wrt=[0])
    assert not bad.passed, str(bad)


def test_cotangents_and_comparisons_on_the_device_are_the_host_ones(no_host_copies):
    from tilegrad import _check
    from tilegrad._intercept import using_backend

    o = torch.empty(1001, 37, device="cuda")
    with using_backend("gpu"):
        dev = [_check._cotangent(o.to(dt), 7, 1, 2) for dt in (torch.float32, torch.float64)]
    host = [_check._cotangent(o.cpu().to(dt), 7, 1, 2) for dt in (torch.float32, torch.float64)]
    for a, b in zip(dev, host):
        assert a.is_cuda and a.dtype == b.dtype and torch.equal(a.cpu(), b)
        assert 0.9 < float(b.double().std()) < 1.1
    # A failing check's figures: computed on the device, the host's.
    gen = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randn(67, 300, device="cuda", generator=gen)
    w = torch.rand(300, device="cuda", generator=gen) + 0.5
    bad_gpu = tilegrad.check_function(L.RMSNormScaledDW, x, w, backend="gpu", seed=5).to_dict()["gradients"]
    bad_cpu = tilegrad.check_function(L.RMSNormScaledDW, x.cpu(), w.cpu(), backend="cpu", seed=5).to_dict()["gradients"]
    for g, c in zip(bad_gpu, bad_cpu):
        assert (g["passed"], g["over_tolerance"], g["nan"], g["inf"]) == (c["passed"], c["over_tolerance"], c["nan"], c["inf"]), (g, c)
        assert g["normwise_rel_err"] == pytest.approx(c["normwise_rel_err"], rel=1e-5), (g, c)
    assert not bad_gpu[1]["passed"] and bad_gpu[1]["error_map"] is not None


@triton.jit
def _row_rms_scale(X, W, OUT, n_cols, BLOCK: tl.constexpr):
    # Two loops over a row's column blocks (the VJP kernel tapes them): sum of squares, then scale.
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(X + row * n_cols + cols, mask=cols < n_cols, other=0.0)
        acc += x * x
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + 1e-6)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        m = cols < n_cols
        x = tl.load(X + row * n_cols + cols, mask=m, other=0.0)
        w = tl.load(W + cols, mask=m)
        tl.store(OUT + row * n_cols + cols, x * rstd * w, mask=m)


def _row_rms(x, w):
    out = torch.empty_like(x)
    _row_rms_scale[(x.shape[0],)](x, w, out, x.shape[1], BLOCK=64)
    return out


def test_vjp_kernels_run_on_device_memory_and_give_the_evaluator_gradients():
    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(37, 300, device="cuda", generator=gen)
    w = torch.rand(300, device="cuda", generator=gen) + 0.5
    cot = torch.randn(37, 300, device="cuda", generator=gen)
    on_gpu = tilegrad.vjp(_row_rms, (x, w), (cot,), backend="gpu", ground="kernels")
    on_cpu = tilegrad.vjp(_row_rms, (x.cpu(), w.cpu()), (cot.cpu(),), backend="cpu")
    for a, b in zip(on_gpu, on_cpu):
        assert a.is_cuda and a.dtype == torch.float64
        # The VJP kernel adds its atomics in the device's order: equal up to f64 rounding.
        torch.testing.assert_close(a.cpu(), b, rtol=1e-11, atol=1e-12)
    assert float(on_cpu[1].abs().max()) > 0.1  # a gradient of substance, not zeros


def test_check_function_with_vjp_kernels_in_place_keeps_the_verdicts(no_host_copies):
    gen = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(67, 300, device="cuda", generator=gen)
    w = torch.rand(300, device="cuda", generator=gen) + 0.5
    good = tilegrad.check_function(L.RMSNorm, x, w, backend="gpu", ground="kernels", seed=5)
    ref = tilegrad.check_function(L.RMSNorm, x.cpu(), w.cpu(), backend="cpu", seed=5)
    assert good.passed and ref.passed, f"{good}\n{ref}"
    g, c = good.to_dict()["gradients"], ref.to_dict()["gradients"]
    assert g[0]["max_abs_err"] == pytest.approx(c[0]["max_abs_err"], rel=1e-6, abs=1e-12), (g[0], c[0])
    bad = tilegrad.check_function(L.RMSNormScaledDW, x, w, backend="gpu", ground="kernels", seed=5)
    assert not bad.passed and "FAIL" in str(bad), str(bad)


@triton.jit
def _row_sum_sq(X, OUT, n, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(X + row * n + offs, mask=offs < n)  # masked-off lanes read as 0, then summed
    tl.store(OUT + row, tl.sum(x * x, axis=0))


def _sum_sq(x):
    out = torch.empty(x.shape[0], device=x.device, dtype=x.dtype)
    _row_sum_sq[(x.shape[0],)](x, out, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


def test_notes_of_masked_lanes_are_found_on_the_device_as_on_the_host(no_host_copies):
    x = torch.randn(9, 100, device="cuda")
    on_gpu = tilegrad.check_backward(_sum_sq, lambda x, g: (2 * x * g[:, None],), [x], backend="gpu")
    on_cpu = tilegrad.check_backward(_sum_sq, lambda x, g: (2 * x * g[:, None],), [x.cpu()], backend="cpu")
    # Passing: the forward's output was put back after the poisoned runs (NaN otherwise).
    assert on_gpu.passed and on_cpu.passed, f"{on_gpu}\n{on_cpu}"
    assert [n["kind"] for n in on_gpu.notes] == [n["kind"] for n in on_cpu.notes] == ["masked_lanes"], on_gpu.notes
    assert on_gpu.notes[0]["message"] == on_cpu.notes[0]["message"], (on_gpu.notes, on_cpu.notes)


def test_a_launch_in_f64_over_f32_cuda_storages_runs_on_device_copies_in_f64(no_host_copies):
    # A replay in f64 whose host code keeps f32 buffers: the launch runs on f64 device copies,
    # its results rounded back into them, as the host path rounds them.
    from tilegrad._intercept import intercepting, using_backend

    n = 10_007
    gen = torch.Generator(device="cuda").manual_seed(8)
    x, y = torch.randn(n, device="cuda", generator=gen), torch.randn(n, device="cuda", generator=gen)

    def axpy(backend, promote, dev):
        out = torch.zeros(n, device=dev)
        with using_backend(backend), intercepting(lambda call: call.run(promote=promote)):
            _axpy[(triton.cdiv(n, 256),)](x.to(dev), y.to(dev), out, 1.1, n, BLOCK=256)
        return out.cpu()

    on_device = axpy("gpu", True, "cuda")
    assert torch.equal(on_device, axpy("cpu", True, "cpu"))
    assert not torch.equal(on_device, axpy("cpu", False, "cpu"))  # f64 arithmetic, rounded once
