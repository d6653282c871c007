"""A persistent command (spec.worker.persistent): one process of the user's command serving shard
after shard (docs/architecture.md, "Persistent commands").

A CommandServer keeps at most one ServedProcess between shards; each shard's turn is a ServedCommand,
driven by the runtime as a Command is (runner.ShardCommand): a request line per shard on the
process's stdin, an answer line on its stdout. The process is started and stopped as runner.py starts
and stops any command (its own process group, the parent-death signal).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from shardops.api.enums import ErrorClass
from shardops.api.worker import PERSISTENT_ENV
from shardops.worker.runner import (
    SNIPPET,
    CommandFailure,
    ask_group_to_stop,
    bad_output,
    close_fd,
    exit_code,
    kill_group,
    pidfd_of,
    spawn,
    wait_for_exit,
    wait_readable,
)

# The most a persistent command may write to stdout without a newline: an answer is a few bytes.
_ANSWER_MAX = 64 * 1024
_READ_SIZE = 64 * 1024


@dataclass(eq=False)
class ServedProcess:
    """One process of a persistent command, kept by a CommandServer from shard to shard. Its stdin
    takes one request line per shard, its stdout gives one answer line per shard; both pipes are
    non-blocking, so the worker's loop never waits on the process."""

    argv: tuple[str, ...]
    env: dict[str, str]
    # Its working directory, made for it (a command started per shard gets the attempt's directory,
    # which goes with the shard; this one goes with the process).
    directory: Path
    popen: subprocess.Popen[bytes]
    lines: deque[bytes] = field(default_factory=deque)
    # What follows the last newline on stdout so far.
    partial: bytes = b""
    closed: bool = False
    # Its stdout reached its end (the process closed it: it is ending).
    eof: bool = False
    # Readable once the process ends (ServedCommand.wait); closed by end().
    pidfd: int | None = None
    # It took a request: a process started ahead (CommandServer.start_ahead) has not yet.
    served: bool = False

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str], base: Path | None) -> ServedProcess:
        try:
            if base is not None:
                base.mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix="served-", dir=base))
        except OSError as error:
            raise CommandFailure(
                ErrorClass.UNKNOWN, f"cannot make the persistent command's directory: {error}"
            ) from None
        try:
            popen = spawn(argv, env, directory, pipes=True)
        except CommandFailure:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        assert popen.stdin is not None and popen.stdout is not None
        os.set_blocking(popen.stdin.fileno(), False)
        os.set_blocking(popen.stdout.fileno(), False)
        return cls(tuple(argv), dict(env), directory, popen, pidfd=pidfd_of(popen.pid))

    def ends_or_answers(self) -> list[int]:
        """What turns readable when it answers (its stdout, until its end) or ends (its pidfd)."""
        fds = [] if self.pidfd is None else [self.pidfd]
        if not self.closed and not self.eof and self.popen.stdout is not None:
            fds.append(self.popen.stdout.fileno())
        return fds

    @property
    def pid(self) -> int:
        return self.popen.pid

    def send(self, request: bytes) -> None:
        """Write one request line, whole or not at all: BrokenPipeError when the process closed its
        stdin (it is ending), BlockingIOError when the pipe has no room for the line (it is not
        reading its requests). Either way the process cannot serve this request."""
        assert self.popen.stdin is not None
        written = os.write(self.popen.stdin.fileno(), request)
        if written < len(request):
            raise BlockingIOError(
                errno.EAGAIN, f"the pipe took {written} of the request's {len(request)} bytes"
            )

    def next_line(self) -> bytes | None:
        """The next whole, non-blank line the process wrote to stdout, or None for now."""
        self._read()
        return self.lines.popleft() if self.lines else None

    @property
    def overlong(self) -> bool:
        """It wrote more to stdout than any answer line without ending the line."""
        return len(self.partial) > _ANSWER_MAX

    def _read(self) -> None:
        if self.closed:
            return
        assert self.popen.stdout is not None
        while not self.overlong:
            try:
                chunk = os.read(self.popen.stdout.fileno(), _READ_SIZE)
            except BlockingIOError:
                return
            if not chunk:
                self.eof = True
                return
            *whole, self.partial = (self.partial + chunk).split(b"\n")
            self.lines.extend(line for line in whole if line.strip())

    def unfit_for(self, argv: Sequence[str], env: Mapping[str, str]) -> str | None:
        """Why this process cannot serve a next shard of `argv` with `env` (None: it can)."""
        returncode = self.popen.poll()
        if returncode is not None:
            return f"it ended between shards (exit {exit_code(returncode)})"
        if tuple(argv) != self.argv or dict(env) != self.env:
            return "the next shard's command or environment differs"
        self._read()
        if self.lines or self.partial.strip():
            # Out of step with its requests: its next line would pass for the next shard's answer.
            return "it wrote to stdout between shards"
        return None

    def end(self, keep_directory: bool) -> None:
        """SIGKILL what is left of its group, reap it, close the pipes, remove its directory."""
        kill_group(self.popen)
        close_fd(self.pidfd)
        self.pidfd = None
        if not self.closed:
            self.closed = True
            for pipe in (self.popen.stdin, self.popen.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            if not keep_directory:
                shutil.rmtree(self.directory, ignore_errors=True)


class Served(NamedTuple):
    """The process that took a shard's request: started for it or not, and why an earlier one went."""

    process: ServedProcess
    started: bool
    replaced: str | None


@dataclass
class CommandServer:
    """A worker's persistent command between shards: at most one live process (a worker runs one
    shard at a time). It is replaced when it ended, misbehaved, or a shard needs another command or
    environment, and ended when the worker exits (`close`)."""

    # Where its working directory goes (SHARDOPS_WORK_DIR; None: TMPDIR), and whether to keep it.
    base: Path | None = None
    keep_directories: bool = False
    process: ServedProcess | None = None

    def start_ahead(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        """Start a process of `argv` with `env` now, before any shard needs it (none is live), so its
        start (an interpreter and its imports) overlaps the worker's first look and claim instead of
        the first shard's run. The first shard that fits it takes it (`serve`), as a process started
        for that shard: it counts as started then. From the slot's thread (`spawn`)."""
        if self.process is None:
            self.process = ServedProcess.start(argv, env, self.base)

    def serve(self, argv: Sequence[str], env: Mapping[str, str], request: bytes) -> Served:
        """A process of `argv` with `env` that took `request`: the live one when it fits, else a new
        one; `started` when this is its first request. From the slot's thread (`spawn`)."""
        replaced = None
        current = self.process
        if current is not None:
            replaced = current.unfit_for(argv, env)
            if replaced is None:
                try:
                    current.send(request)
                    first, current.served = not current.served, True
                    return Served(current, started=first, replaced=None)
                except (BrokenPipeError, BlockingIOError) as error:
                    replaced = f"it did not take the request ({error})"
            self.discard(current)
        process = ServedProcess.start(argv, env, self.base)
        process.served = True
        self.process = process
        try:
            process.send(request)
        except BrokenPipeError:
            pass  # It ended already: ServedCommand.poll reports its exit as the shard's.
        except BlockingIOError:
            self.discard(process)
            raise CommandFailure(
                ErrorClass.UNKNOWN,
                f"the request line ({len(request)} bytes) does not fit in a persistent command's stdin pipe",
            ) from None
        return Served(process, started=True, replaced=replaced)

    def discard(self, process: ServedProcess) -> None:
        process.end(self.keep_directories)
        if self.process is process:
            self.process = None

    def close(self, grace: float, wait: Callable[[float], object] = time.sleep) -> None:
        """At the worker's exit: end of input asks the process to end; after `grace` seconds SIGKILL
        ends its group."""
        process = self.process
        if process is None:
            return
        if process.popen.stdin is not None:
            with contextlib.suppress(OSError):
                process.popen.stdin.close()
        wait_for_exit(process.popen, grace, wait)
        self.discard(process)


def answer_code(line: bytes, shard: str) -> int:
    """The exit code of a persistent command's answer line `{"shard": <name>, "exit": <0-255>}`;
    anything else is the shard's bad output. The answer names its shard, so a line the command wrote
    out of turn can never pass for this shard's answer."""
    try:
        value = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        value = None
    code = value.get("exit") if isinstance(value, dict) else None
    named = value.get("shard") if isinstance(value, dict) else None
    if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255 or named != shard:
        snippet = line[:SNIPPET].decode("utf-8", errors="replace")
        raise bad_output(
            f"the persistent command's answer for shard {shard} must be one line "
            f'{{"shard": "{shard}", "exit": <0-255>}}, got: {snippet!r} (stdout is the protocol '
            "channel: write logs to stderr)"
        )
    return code


@dataclass
class ServedCommand:
    """One shard's turn of a persistent command, with Command's interface. start() hands the shard to
    the CommandServer's process as a request line; poll() gives the code of its answer line, or the
    process's exit code when it ended before answering (as a command started for the shard would
    have exited). Stopping the shard before its answer (terminate, kill) ends the whole process
    group, and the next shard starts a new process; after the answer kill() leaves the process to
    the next shard."""

    server: CommandServer
    argv: Sequence[str]
    # The shard's whole environment, as a Command would get it.
    env: Mapping[str, str]
    # The names in env whose values are this shard's own: sent with the request, not at the start.
    shard_variables: Collection[str]
    shard: str
    process: ServedProcess | None = None
    signalled: bool = False
    new_process: bool = False
    # Why the process that served the previous shard was not used for this one (None: it was, or
    # there was none).
    replaced: str | None = None
    answered: bool = False
    code: int | None = None
    started_at: float = field(default=0.0)
    ended_at: float | None = None

    def start(self) -> None:
        process_env = served_process_env(self.env, self.shard_variables)
        request = {
            "shard": self.shard,
            "env": {k: v for k, v in self.env.items() if k in self.shard_variables},
        }
        line = json.dumps(request, separators=(",", ":")) + "\n"
        served = self.server.serve(self.argv, process_env, line.encode())
        self.process, self.new_process, self.replaced = served
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def poll(self) -> int | None:
        """The shard's exit code once known: its answer's, or the process's exit without one."""
        process = self.process
        if self.code is not None or process is None:
            return self.code
        # Before reading: an answer written right before the process ended is read below.
        returncode = process.popen.poll()
        line = process.next_line()
        if line is not None:
            self.code = answer_code(line, self.shard)
            self.answered = True
        elif process.overlong:
            raise bad_output(
                f"the persistent command wrote over {_ANSWER_MAX} bytes to stdout for shard {self.shard} "
                "without a newline; its answer is one short line (logs go to stderr)"
            )
        elif returncode is not None:
            self.code = exit_code(returncode)
        else:
            return None
        self.ended_at = time.monotonic()
        return self.code

    def seconds(self) -> float | None:
        """How long the shard's turn took (so far, while it runs); None when it never started."""
        if self.process is None:
            return None
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    def wait(self, seconds: float) -> None:
        if self.process is None or self.code is not None:
            return
        wait_readable(self.process.ends_or_answers(), seconds)

    def terminate(self, grace: float, wait: Callable[[float], object] = time.sleep) -> int | None:
        """Before the answer: SIGTERM to the group, SIGKILL after `grace` seconds; the shard's code."""
        if self.process is None or self.answered:
            return self.code
        self.signalled = True
        ask_group_to_stop(self.process.popen, grace, wait)
        return self.kill()

    def kill(self) -> int | None:
        """Before the answer: SIGKILL the whole group and reap it (the process serves no other shard).
        After it: nothing, the process waits for the next shard."""
        process = self.process
        if process is None or self.answered:
            return self.code
        if process.popen.poll() is None:
            self.signalled = True
        self.server.discard(process)
        returncode = process.popen.poll()
        if self.code is None and returncode is not None:
            self.code = exit_code(returncode)
            self.ended_at = time.monotonic()
        return self.code


def served_process_env(env: Mapping[str, str], shard_variables: Collection[str]) -> dict[str, str]:
    """A persistent process's environment: a shard's whole `env` without the variables whose values
    are that shard's own (they go with each request), marked SHARDOPS_PERSISTENT=1."""
    return {k: v for k, v in env.items() if k not in shard_variables} | {PERSISTENT_ENV: "1"}
