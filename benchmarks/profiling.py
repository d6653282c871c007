"""Where a Python process spends its time: py-spy (from PyPI, the `bench` extra) attached to a
running operator or worker, summarized as the functions seen most often on the CPU.

py-spy samples only threads that are running (not idle ones), so the shares are of busy time.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = re.compile(r"^(.*/)?(site-packages|lib/python3\.\d+|operator|examples/agent)/")
FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


# Where a busy thread is not running Python: waiting for an answer on a socket (the API server), or
# blocked in a selector or a lock (py-spy counts a thread in a blocking call as busy).
NETWORK_LEAVES = ("SSLSocket.read", "SSLSocket.recv", "SSLSocket.send", "SSLSocket.sendall", "socket.recv")
WAITING_LEAVES = (
    "EpollSelector.select",
    "_PollLikeSelector.select",
    "select (",
    "Condition.wait",
    "Event.wait",
)


@dataclass
class Profile:
    what: str
    samples: int
    inclusive: Counter[str] = field(default_factory=Counter)
    leaf: Counter[str] = field(default_factory=Counter)
    # Samples that ran Python (neither on a socket nor blocked), and the frames on their stacks.
    computing: int = 0
    computing_inclusive: Counter[str] = field(default_factory=Counter)
    network: int = 0
    waiting: int = 0
    error: str | None = None
    raw: str | None = None

    def share(self, count: int) -> float:
        return 100.0 * count / max(self.samples, 1)

    def top(self, counter: Counter[str], count: int = 12) -> list[tuple[str, float]]:
        total = max(self.samples, 1)
        return [(name, 100.0 * n / total) for name, n in counter.most_common(count)]


def _short(frame: str) -> str:
    match = FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    # Paths relative to where they live: site-packages, the standard library, the repository.
    path = PREFIX.sub("", match.group("file"))
    return f"{match.group('function')} ({path})"


def parse(what: str, text: str) -> Profile:
    """py-spy's raw (collapsed) output: one line per distinct stack, `frame;frame;... count`."""
    profile = Profile(what, 0)
    for line in text.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_short(f) for f in stack.split(";")[1:] if f]  # the first element is the thread
        if not frames:
            continue
        profile.samples += count
        for name in set(frames):
            profile.inclusive[name] += count
        leaf = frames[-1]
        profile.leaf[leaf] += count
        if leaf.startswith(NETWORK_LEAVES):
            profile.network += count
        elif leaf.startswith(WAITING_LEAVES):
            profile.waiting += count
        else:
            profile.computing += count
            for name in set(frames):
                profile.computing_inclusive[name] += count
    return profile


def record(what: str, pid: int, seconds: float, out: Path, rate: int = 50) -> Profile:
    binary = py_spy()
    if binary is None:
        return Profile(what, 0, error="py-spy is not installed (pip install -e '.[bench]')")
    command = [
        binary,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(max(1, round(seconds))),
        "--rate",
        str(rate),
        "--nonblocking",
        "--format",
        "raw",
        "--output",
        str(out),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60, check=False)
    if result.returncode != 0 or not out.exists():
        return Profile(what, 0, error=(result.stderr or result.stdout).strip()[-500:] or "py-spy failed")
    profile = parse(what, out.read_text())
    profile.raw = str(out)
    return profile


class Background:
    """A profile of the process `pid_of()` names, taken `delay` seconds from now, without blocking."""

    def __init__(
        self, what: str, pid_of: Callable[[], int | None], delay: float, seconds: float, out: Path
    ) -> None:
        self.result: Profile | None = None
        self._thread = threading.Thread(
            target=self._run, args=(what, pid_of, delay, seconds, out), name="bench-profile", daemon=True
        )
        self._thread.start()

    def _run(
        self, what: str, pid_of: Callable[[], int | None], delay: float, seconds: float, out: Path
    ) -> None:
        time.sleep(delay)
        pid = None
        for _ in range(20):  # the process may still be starting: a few seconds at most
            pid = pid_of()
            if pid:
                break
            time.sleep(0.5)
        if not pid:
            self.result = Profile(what, 0, error="no process to profile")
            return
        self.result = record(what, pid, seconds, out)

    def wait(self, timeout: float) -> Profile | None:
        self._thread.join(timeout)
        return self.result
