"""The f64 kernels a check compiles ahead on the GPU are the ones its ground truth and its f64
replay launch: a launch in the kernels' dtypes guesses the kernel the ground truth will convert
(`_Conversion.promoted_guess`), and every launch on the check's f64 copies converts that same
kernel, the forward that a Function's backward runs again within the replay included. Where they
differed, each f64 launch waited for a compile of its own (1 to 2.5 s each at training sizes).
The guess is made on the CPU too, so that this runs without a GPU."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

import functions_liger_style as L  # noqa: E402
import tilegrad  # noqa: E402
from tilegrad import _intercept  # noqa: E402


def _launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, bool, object]]:
    """Every launch a check runs: (kernel, promoted, on f64 tensors, its `LaunchCall`)."""
    seen: list[tuple[str, bool, bool, object]] = []
    run = _intercept.LaunchCall.run

    def recording(self, **kw):
        f64 = all(s.dtype == "f64" for s in self.storages.items if s.dtype in ("f16", "bf16", "f32", "f64"))
        seen.append((self.name, bool(kw.get("promote", False)), f64, self))
        return run(self, **kw)

    monkeypatch.setattr(_intercept.LaunchCall, "run", recording)
    return seen


def test_the_ground_truth_and_the_replay_launch_the_kernels_guessed_ahead(monkeypatch):
    seen = _launches(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(37, 100, generator=gen), torch.randn(100, generator=gen)
    r = tilegrad.check_function(L.RMSNorm, x, w, backend="cpu", trials=2)
    assert r.passed, r
    native = [(n, c) for n, promote, f64, c in seen if not f64]
    on_f64 = [(n, promote, c) for n, promote, f64, c in seen if f64]
    assert {n for n, _ in native} == {"rms_norm_fwd", "rms_norm_bwd"}
    assert {n for n, _, _ in on_f64} == {"rms_norm_fwd", "rms_norm_bwd"}
    guessed = {n: c.conversion.promoted_guess() for n, c in native}
    for n, promote, c in on_f64:
        # Every launch on the f64 copies computes in f64, the replay's forward too.
        assert promote, f"`{n}` ran on f64 tensors in the kernels' dtypes"
        # The very kernel guessed (one conversion, so one set of compiled forms).
        assert c.kernel is guessed[n], f"`{n}`: the f64 launch converted another kernel than the one guessed"


def test_the_guess_promotes_float_tensors_and_keeps_the_others():
    conv = _intercept._Conversion(
        "f.py", "src", "k", (("BLOCK", "int", 4),), (("X", "f32"), ("I", "i32"), ("H", "bf16")), (("eps", "f32"),), (("D", "f16", (4, 4)),), False, ()
    )
    promoted_key = conv.promoted_guess_key()
    assert promoted_key.ptr_dtypes == (("X", "f64"), ("I", "i32"), ("H", "f64"))
    assert promoted_key.descriptors == (("D", "f64", (4, 4)),)
    assert promoted_key.scalar_dtypes == conv.scalar_dtypes and promoted_key.constexprs == conv.constexprs
    assert promoted_key.promoted
