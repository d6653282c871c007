"""free_port: loopback ports from below the kernel's ephemeral range, in turn across processes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from testbed.cluster import lifecycle


@pytest.fixture
def taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ports"
    monkeypatch.setattr(lifecycle, "PORTS_TAKEN", path)
    return path


def test_ports_come_in_turn_below_the_ephemeral_range(taken: Path) -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    first, second = lifecycle.free_port(), lifecycle.free_port()
    assert second != first and lifecycle.PORTS.stop <= low
    assert first in lifecycle.PORTS and second in lifecycle.PORTS
    assert taken.read_text() == str(second), "the next process goes on from the last one handed out"


def test_a_port_in_use_is_passed_over_and_the_turn_wraps(taken: Path) -> None:
    last = lifecycle.PORTS[-1]
    taken.write_text(str(last - 1))
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", last))
        listener.listen()
        port = lifecycle.free_port()
    # The last port is in use: the turn starts again from the first (the first free one of them).
    assert lifecycle.PORTS[0] <= port < last - 1, port
