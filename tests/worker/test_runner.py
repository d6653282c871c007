"""The command runner: reading results as they are written, error files, and the process group."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardops.api.enums import ErrorClass
from shardops.api.item_errors import item_error_of
from shardops.worker import runner
from shardops.worker.runner import (
    AttemptFiles,
    Command,
    CommandFailure,
    ResultLine,
    ResultsReader,
    WorkItem,
    command_env,
    read_error_file,
)
from tests import workerkit


def _reader(
    tmp_path: Path, keys: tuple[str, ...] = ("a", "b", "c"), cap: int = 1000
) -> tuple[Path, ResultsReader]:
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"")
    return path, ResultsReader(path, keys, cap)


def _append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


def test_reader_takes_whole_lines_only_and_keeps_the_first_result_per_key(tmp_path: Path) -> None:
    path, reader = _reader(tmp_path)
    _append(path, b'{"key": "a", "result": 1, "cost": 0.5}\n{"key": "b", "res')
    assert reader.poll() == [ResultLine("a", 1, 0.5)]
    _append(path, b'ult": {"x": [1]}}\n\n{"key": "a", "result": 99}\n')
    assert reader.poll() == [ResultLine("b", {"x": [1]}, 0.0)]
    assert reader.poll() == []


def test_an_error_line_is_the_items_errored_result(tmp_path: Path) -> None:
    path, reader = _reader(tmp_path)
    _append(
        path,
        b'{"key": "a", "error": {"class": "invalid-input", "message": "400: too long", "code": "ctx"}, '
        b'"result": {"statusCode": 400}}\n',
    )
    (line,) = reader.poll()
    assert item_error_of(line.result) == {"class": "invalid-input", "message": "400: too long", "code": "ctx"}
    assert line.result["result"] == {"statusCode": 400}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"this is not JSON {\n", "results line 1 is not valid JSON"),
        (b"[1, 2]\n", "must be a JSON object"),
        (b'{"key": "zzz", "result": 1}\n', "key 'zzz' is not one of this attempt's items"),
        (b'{"key": "a"}\n', "no result (nor error) for key a"),
        (b'{"key": "a", "error": "broken"}\n', "error must be an object"),
        (b'{"key": "a", "error": {"class": "timeout", "message": "m"}}\n', "cannot be an item's own error"),
        (b'{"key": "a", "result": NaN}\n', "has no exact JSON form"),
        (b'{"key": "a", "result": 1, "cost": -1}\n', "cost must be a number >= 0"),
        (b'{"key": "a", "result": 1, "cost": "three"}\n', "cost must be a number >= 0"),
        (b"\xff\xfe\n", "results line 1 is not valid JSON"),
    ],
)
def test_reader_rejects_a_bad_line_with_its_number(tmp_path: Path, line: bytes, message: str) -> None:
    path, reader = _reader(tmp_path)
    with pytest.raises(CommandFailure, match=re.escape(message)) as failure:
        _append(path, line)
        reader.poll()
    assert failure.value.error_class is ErrorClass.BAD_OUTPUT


def test_reader_counts_lines_across_polls(tmp_path: Path) -> None:
    path, reader = _reader(tmp_path)
    _append(path, b'{"key": "a", "result": 1}\n')
    reader.poll()
    _append(path, b'{"key": "b", "result": 1}\ngarbage\n')
    with pytest.raises(CommandFailure, match="results line 3 is not valid JSON"):
        reader.poll()


def test_a_last_line_without_newline_counts_unless_cut_short_by_a_stop(tmp_path: Path) -> None:
    path, reader = _reader(tmp_path)
    _append(path, b'{"key": "a", "result": 1}')
    assert reader.poll() == []
    assert reader.finish(tolerate_partial=False) == [ResultLine("a", 1, 0.0)]

    path, reader = _reader(tmp_path)
    _append(path, b'{"key": "a", "result": 1}\n{"key": "b", "resu')
    assert reader.finish(tolerate_partial=True) == [ResultLine("a", 1, 0.0)]
    path, reader = _reader(tmp_path)
    _append(path, b'{"key": "b", "resu')
    with pytest.raises(CommandFailure):
        reader.finish(tolerate_partial=False)


def test_a_line_growing_past_the_cap_is_result_too_large(tmp_path: Path) -> None:
    path, reader = _reader(tmp_path, cap=100)
    _append(path, b'{"key": "a", "result": "' + b"x" * 200)
    with pytest.raises(CommandFailure) as failure:
        reader.poll()
    assert failure.value.error_class is ErrorClass.RESULT_TOO_LARGE


def test_error_file_is_used_only_when_it_is_a_json_object(tmp_path: Path) -> None:
    path = tmp_path / "error.json"
    assert read_error_file(path) is None
    path.write_text('{"class": "429", "message": "slow down"}')
    assert read_error_file(path) == {"class": "429", "message": "slow down"}
    for junk in ("", "not json", "[1]", "x" * 70_000):
        path.write_text(junk)
        assert read_error_file(path) is None


def test_attempt_files_hold_the_remaining_items(tmp_path: Path) -> None:
    files = AttemptFiles.create([WorkItem("k1", 3, {"a": 1})], "shard-a1-", tmp_path)
    assert files.items.read_text() == '{"key":"k1","index":3,"item":{"a":1}}\n'
    assert files.results.exists() and files.results.read_text() == ""
    files.remove()
    assert not files.directory.exists()


def test_command_env_hides_the_workers_credentials_and_lets_the_user_win() -> None:
    env = command_env(
        {"PATH": "/bin", "KUBECONFIG": "/secret", "SHARDOPS_SOURCE": "old"},
        {"SHARDOPS_SOURCE": "A", "SHARDOPS_ATTEMPT": "2"},
        {"SHARDOPS_ATTEMPT": "user", "EXTRA": "1"},
    )
    assert env == {"PATH": "/bin", "SHARDOPS_SOURCE": "A", "SHARDOPS_ATTEMPT": "user", "EXTRA": "1"}


def _python(code: str, tmp_path: Path) -> Command:
    return Command([sys.executable, "-c", code], dict(os.environ), tmp_path)


def test_missing_and_unexecutable_commands_are_command_not_found(tmp_path: Path) -> None:
    with pytest.raises(CommandFailure, match="command not found: 'no-such-program-xyz'") as failure:
        Command(["no-such-program-xyz"], {}, tmp_path).start()
    assert failure.value.error_class is ErrorClass.COMMAND_NOT_FOUND
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(CommandFailure, match="cannot be executed") as failure:
        Command([str(script)], {}, tmp_path).start()
    assert failure.value.error_class is ErrorClass.COMMAND_NOT_FOUND


def test_exit_codes_and_signals_read_like_a_shell(tmp_path: Path) -> None:
    command = _python("import sys; sys.exit(75)", tmp_path)
    command.start()
    assert command.popen is not None and command.popen.wait(10) == 75
    assert command.poll() == 75 and not command.signalled
    killed = _python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", tmp_path)
    killed.start()
    assert killed.popen is not None
    killed.popen.wait(10)
    assert killed.poll() == 128 + signal.SIGKILL


def test_a_wait_ends_at_the_commands_exit_not_at_its_timeout(tmp_path: Path) -> None:
    """The worker's tick waits on the process (its pidfd): the end is seen when it comes. A process
    that keeps running holds the wait for its whole length."""
    quick = _python("import time; time.sleep(0.05)", tmp_path)
    quick.start()
    began = time.monotonic()
    quick.wait(30)
    assert time.monotonic() - began < 20, "the wait ran to its timeout, not to the exit"
    assert quick.poll() == 0 and quick.pidfd is None, "the end seen, the descriptor closed"
    quick.wait(30)  # ended: returns at once
    slow = _python("import time; time.sleep(60)", tmp_path)
    slow.start()
    began = time.monotonic()
    slow.wait(0.2)
    assert time.monotonic() - began >= 0.2 and slow.poll() is None
    assert slow.kill() == 128 + signal.SIGKILL and slow.pidfd is None


def test_terminate_reaches_the_whole_process_group_and_escalates(tmp_path: Path) -> None:
    marker = tmp_path / "grandchild.pid"
    # The command starts a grandchild that ignores SIGTERM: only the group SIGKILL ends it.
    code = (
        "import subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    command = _python(code, tmp_path)
    command.start()
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline, "grandchild did not start"
        time.sleep(0.02)
    grandchild = int(marker.read_text())
    assert command.pid is not None and os.getpgid(grandchild) == command.pid != os.getpgid(0)
    started = time.monotonic()
    assert command.terminate(grace=0.5) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5 and command.signalled
    deadline = time.monotonic() + 5
    while True:
        try:
            with open(f"/proc/{grandchild}/stat") as handle:
                if handle.read().split(")")[-1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        assert time.monotonic() < deadline, "the grandchild survived the group kill"
        time.sleep(0.02)


def test_the_command_dies_with_the_worker(tmp_path: Path) -> None:
    marker = tmp_path / "command.pid"
    # A stand-in worker that starts a long command and is then killed outright.
    worker = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from shardops.worker.runner import Command\n"
        "argv = [sys.executable, '-c', 'import time; time.sleep(60)']\n"
        f"c = Command(argv, dict(os.environ), Path({str(tmp_path)!r}))\n"
        "c.start()\n"
        f"open({str(marker)!r}, 'w').write(str(c.pid))\n"
        "import time; time.sleep(60)\n"
    )
    parent = _python(worker, tmp_path)
    parent.start()
    deadline = time.monotonic() + 10
    while not marker.exists() or not marker.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    command_pid = int(marker.read_text())
    _wait_for_the_exec(command_pid)
    parent.kill()
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{command_pid}"):
        with open(f"/proc/{command_pid}/stat") as handle:
            if handle.read().split(")")[-1].split()[0] == "Z":
                break
        assert time.monotonic() < deadline, "the command outlived its worker"
        time.sleep(0.02)


_PARENT = """
import sys, time
from pathlib import Path
from shardops.worker import runner
if sys.argv[1] == "preexec":
    runner._SETPRIV = None
command = runner.Command([sys.executable, "-c", "import time; time.sleep(600)"], {}, Path(sys.argv[2]))
command.start()
print(command.pid, flush=True)
time.sleep(600)
"""


def _wait_for_the_exec(pid: int) -> None:
    """setpriv arms the parent-death signal, then execs the command: a worker killed before that
    leaves the command running (a window of about a millisecond per start), so a test of the signal
    kills the worker only once the command runs."""
    if runner._SETPRIV is None:
        return
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0] == runner._SETPRIV.encode():
        assert time.monotonic() < deadline, "setpriv did not exec the command"
        time.sleep(0.01)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["setpriv", "preexec"])
def test_a_command_dies_with_its_worker(launcher: str, tmp_path: Path) -> None:
    if launcher == "setpriv" and runner._SETPRIV is None:
        pytest.skip("setpriv is not installed")
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, launcher, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert not workerkit.process_gone(child)
    _wait_for_the_exec(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while not workerkit.process_gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert workerkit.process_gone(child), f"command {child} outlived its worker ({launcher})"
