"""A check runs torch with one intra-op thread (its many small host ops would otherwise contend
with the engine's threads for the cores) and gives the caller's thread count back after."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

import tilegrad  # noqa: E402
from test_torch_api import square, square_bwd  # noqa: E402


@pytest.fixture
def two_threads():
    prev = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(prev)


def test_a_check_runs_torch_on_one_thread_and_restores_the_count(two_threads):
    seen = []

    def forward(x):
        seen.append(torch.get_num_threads())
        return square(x)

    def backward(x, gy):
        seen.append(torch.get_num_threads())
        return square_bwd(x, gy)

    assert tilegrad.check_backward(forward, backward, [torch.randn(100)]).passed
    assert seen and set(seen) == {1}, seen
    assert torch.get_num_threads() == 2
    g = tilegrad.vjp(forward, [torch.randn(10)], [torch.ones(10)])
    assert g[0].shape == (10,) and seen[-1] == 1 and torch.get_num_threads() == 2


def test_the_count_is_restored_when_the_check_raises(two_threads):
    def forward(x):
        raise ValueError("the user's forward fails")

    with pytest.raises(ValueError, match="the user's forward fails"):
        tilegrad.check_backward(forward, square_bwd, [torch.randn(100)])
    assert torch.get_num_threads() == 2


def test_a_check_of_large_tensors_keeps_torchs_threads(two_threads):
    from tilegrad._threads import LARGE, one_torch_thread

    with one_torch_thread([torch.empty(LARGE - 1)]):
        assert torch.get_num_threads() == 1
    with one_torch_thread([3, torch.empty(LARGE)]):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 2
