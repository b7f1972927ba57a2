"""The package's verdicts agree with the CLI's on the same kernels and sizes: for the weighted sum
(sizes of examples/weighted_sum.toml), the correct backward and each broken variant give the same
pass/fail per gradient and the same kind of failure from `tilegrad check --json` and from
`tilegrad.check_function` on the Python launcher."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import tilegrad  # noqa: E402
from launchers import broken_variants, make  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def cli() -> pathlib.Path:
    env = os.environ.get("TILEGRAD_CLI")
    if env:
        return pathlib.Path(env)
    for p in ("target/release/tilegrad", "target/debug/tilegrad"):
        if (ROOT / p).exists():
            return ROOT / p
    pytest.skip("the tilegrad CLI is not built (cargo build --release)")


def verdict(d: dict) -> tuple:
    failure = d["failure"]
    kind = None
    if failure is not None:
        m = failure["message"].lower()
        kind = "race" if "race" in m else "oob" if "out-of-bounds" in m else "other"
    return d["passed"], kind, tuple((g["name"], g["passed"]) for g in d["gradients"]) if failure is None else ()


@pytest.mark.parametrize("variant", [None, *broken_variants("weighted_sum")])
def test_weighted_sum_verdicts_agree_with_the_cli(variant):
    args = [str(cli()), "check", "examples/weighted_sum.toml", "--json"]
    if variant:
        args += ["--kernel", f"bwd=::{variant}"]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1), p.stderr
    from_cli = verdict(json.loads(p.stdout)[0])

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(1000, 300, generator=gen)
    w = torch.rand(300, generator=gen) * 2 - 1
    r = tilegrad.check_function(make("weighted_sum", variant), x, w)
    assert verdict(r.to_dict()) == from_cli, str(r) + "\n" + p.stdout
