"""The process-kubelet's containerLogs endpoint, its pure part: where `--tail=N` starts."""

from __future__ import annotations

import pytest
from testbed.cluster.kubelet.server import tail_start


@pytest.mark.parametrize(
    ("data", "lines", "expected"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 5, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"", 3, b""),
        (b"a\n", 0, b""),
    ],
)
def test_tail_start(data: bytes, lines: int, expected: bytes) -> None:
    assert data[tail_start(data, lines) :] == expected
