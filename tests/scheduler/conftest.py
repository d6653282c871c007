"""The fixtures of the scheduler's tests: an in-memory API server with the operator's resources, and
the clock the reconcile reads (both from tests/schedulerkit.py). A test module that needs another
clock (test_leader.py) defines its own `clock`."""

from __future__ import annotations

import pytest

from tests.schedulerkit import Clock, OperatorKube


@pytest.fixture
def kube() -> OperatorKube:
    return OperatorKube()


@pytest.fixture
def clock() -> Clock:
    return Clock()
