"""Waiting for other ranks without spinning a core (world.wait_politely), on a stand-in request."""

from __future__ import annotations

import pytest

from dlio_ckpt import world as world_module


class Request:
    """Completes on the n-th Test, like an MPI request whose peers arrive late."""

    def __init__(self, tests_until_done: int) -> None:
        self.left = tests_until_done
        self.tests = 0

    def Test(self) -> bool:  # noqa: N802 (mpi4py's name)
        self.tests += 1
        self.left -= 1
        return self.left <= 0


def test_a_request_done_at_once_never_sleeps(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(world_module.time, "sleep", sleeps.append)
    request = Request(1)
    world_module.wait_politely(request)
    assert request.tests == 1 and sleeps == []


def test_a_late_request_sleeps_with_growing_pauses_up_to_the_cap(monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(world_module.time, "sleep", sleeps.append)
    monkeypatch.setattr(world_module, "POLL_SPIN_S", 0.0)  # straight to the sleeping phase
    request = Request(20)
    world_module.wait_politely(request)
    assert request.tests == 20
    assert sleeps[0] == pytest.approx(world_module.POLL_FIRST_S)
    assert all(b >= a for a, b in zip(sleeps, sleeps[1:]))
    assert max(sleeps) == pytest.approx(world_module.POLL_MAX_S)
