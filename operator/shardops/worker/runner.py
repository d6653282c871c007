"""Running the user's command for one attempt: files, process group, signals, and reading results.

A command runs once per shard (Command), or, with spec.worker.persistent, as one process serving
shard after shard (ServedCommand over a CommandServer's ServedProcess: a request line per shard on
its stdin, an answer line on its stdout). The runtime drives both the same way (ShardCommand).

The command runs in its own process group, so stopping it (lease lost, cost cap, shutdown) reaches
everything it started, and a SIGSTOP of the worker does not stop it. It also gets a parent-death
signal, so a worker that is killed outright does not leave it running: in a pod the container's
end would take it anyway, on a machine without one (the e2e process-kubelet) nothing else would.
The signal is set by util-linux's setpriv(1) where it is installed (every Debian-based image), not
by a preexec_fn: a preexec_fn makes subprocess fork() the whole worker process where it could
vfork() — measured 6.2 against 3.0 ms of CPU per command start, once per shard.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import math
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from shardops.api.common import NO_TOKENS, TokenCounts
from shardops.api.enums import ErrorClass
from shardops.logic.idempotency import canonical_json

ITEMS_FILE = "items.jsonl"
RESULTS_FILE = "results.jsonl"
# The finalize shard's extra input: every finished item of the campaign (SHARDOPS_CAMPAIGN_RESULTS_FILE).
CAMPAIGN_RESULTS_FILE = "campaign-results.jsonl"
ERROR_FILE = "error.json"
# The cooldown of the shard's source, for the built-in LLM worker (its variable: COOLDOWN_FILE_ENV):
# JSON {source, until: epoch seconds, shard} or {}, rewritten at each heartbeat (state/cooldowns.py).
COOLDOWN_FILE = "cooldown.json"
_PR_SET_PDEATHSIG = 1
# Resolved once: the launcher that sets the parent-death signal; None falls back to a preexec_fn.
_SETPRIV = shutil.which("setpriv")
_SNIPPET = 80
# A longer error file is not a structured error any more; its message is cut later anyway.
_ERROR_FILE_MAX = 64 * 1024


class CommandFailure(Exception):
    """The attempt failed for a reason the runtime found itself (not via the command's exit)."""

    def __init__(self, error_class: ErrorClass, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


def bad_output(message: str) -> CommandFailure:
    return CommandFailure(ErrorClass.BAD_OUTPUT, message)


@dataclass(frozen=True)
class ResultLine:
    key: str
    result: Any
    cost: float
    tokens: TokenCounts = NO_TOKENS


@dataclass(frozen=True)
class WorkItem:
    """One line of the items file: the item, its sub-key and its index in the shard."""

    key: str
    index: int
    item: Any

    def line(self) -> str:
        return json.dumps({"key": self.key, "index": self.index, "item": self.item}, separators=(",", ":"))


@dataclass
class AttemptFiles:
    directory: Path
    items: Path
    results: Path
    error: Path

    @property
    def campaign_results(self) -> Path:
        return self.directory / CAMPAIGN_RESULTS_FILE

    @classmethod
    def create(cls, items: Sequence[WorkItem], prefix: str, base: Path | None) -> AttemptFiles:
        if base is not None:
            base.mkdir(parents=True, exist_ok=True)
        directory = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        files = cls(directory, directory / ITEMS_FILE, directory / RESULTS_FILE, directory / ERROR_FILE)
        files.items.write_text("".join(item.line() + "\n" for item in items), encoding="utf-8")
        files.results.touch()
        return files

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def read_error_file(path: Path) -> dict[str, object] | None:
    """The command's structured error, or None when absent or unreadable (then the exit code decides)."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(_ERROR_FILE_MAX + 1)
    except OSError:
        return None
    if not raw.strip() or len(raw) > _ERROR_FILE_MAX:
        return None
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


class ResultsReader:
    """Reads the results file as the command appends to it; only whole lines count.

    Every line must be `{"key": <a remaining sub-key>, "result": <JSON>, "cost": <number ≥ 0>?,
    "tokens": {"input": n, "cachedInput": n, "output": n}?}` (tokens: what the item's model calls
    used, whole numbers ≥ 0, each key optional);
    the first line that is not raises a bad-output CommandFailure naming its line number. A key seen
    twice keeps its first result (the command retried internally; both are results of one input).
    """

    def __init__(self, path: Path, expected: Iterable[str], max_line_bytes: int) -> None:
        self.path = path
        self.expected = frozenset(expected)
        self.max_line_bytes = max_line_bytes
        self.offset = 0
        self.pending = b""
        self.line_number = 0
        self.seen: set[str] = set()

    def poll(self) -> list[ResultLine]:
        """New complete lines since the last call."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.pending += chunk
        *lines, self.pending = self.pending.split(b"\n")
        if len(self.pending) > self.max_line_bytes:
            raise CommandFailure(
                ErrorClass.RESULT_TOO_LARGE,
                f"results line {self.line_number + 1} is over {self.max_line_bytes} bytes and still "
                "growing: over the result size cap",
            )
        return self._parse(lines)

    def finish(self, tolerate_partial: bool) -> list[ResultLine]:
        """Lines written since the last poll, including a last line without a newline.

        `tolerate_partial`: the command was stopped by us, so a last line cut short is dropped (its
        item is simply not done) instead of failing the attempt.
        """
        results = self.poll()
        tail, self.pending = self.pending, b""
        if not tail.strip():
            return results
        try:
            return results + self._parse([tail])
        except CommandFailure:
            if tolerate_partial:
                return results
            raise

    def _parse(self, lines: Iterable[bytes]) -> list[ResultLine]:
        parsed: list[ResultLine] = []
        for raw in lines:
            self.line_number += 1
            if not raw.strip():
                continue
            line = self._line(raw)
            if line.key in self.seen:
                continue
            self.seen.add(line.key)
            parsed.append(line)
        return parsed

    def _line(self, raw: bytes) -> ResultLine:
        where = f"results line {self.line_number}"
        snippet = raw[:_SNIPPET].decode("utf-8", errors="replace")
        try:
            value = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise bad_output(f"{where} is not valid JSON ({detail}): {snippet!r}") from None
        if not isinstance(value, dict):
            raise bad_output(f"{where} must be a JSON object with key and result, got: {snippet!r}")
        key = value.get("key")
        if not isinstance(key, str) or key not in self.expected:
            raise bad_output(f"{where}: key {key!r} is not one of this attempt's items: {snippet!r}")
        if "result" not in value:
            raise bad_output(f"{where}: no result for key {key}: {snippet!r}")
        try:
            canonical_json(value["result"])
        except (TypeError, ValueError) as error:
            raise bad_output(f"{where}: result for key {key} has no exact JSON form ({error})") from None
        cost = value.get("cost", 0)
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost) or cost < 0:
            raise bad_output(f"{where}: cost must be a number >= 0, got {cost!r}")
        return ResultLine(key, value["result"], float(cost), _tokens(value.get("tokens"), where, snippet))


_TOKEN_KINDS = ("input", "cachedInput", "output")


def _tokens(value: object, where: str, snippet: str) -> TokenCounts:
    if value is None:
        return NO_TOKENS
    if not isinstance(value, dict) or set(value) - set(_TOKEN_KINDS):
        raise bad_output(
            f"{where}: tokens must be an object with input, cachedInput and output counts, got: {snippet!r}"
        )
    counts = [value.get(kind, 0) for kind in _TOKEN_KINDS]
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in counts):
        raise bad_output(f"{where}: token counts must be whole numbers >= 0, got {value!r}")
    return TokenCounts(input=counts[0], cached_input=counts[1], output=counts[2])


def _parent_death_signal() -> None:
    # Runs in the child between fork and exec (preexec_fn); Linux only, best effort elsewhere.
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def check_executable(program: str, env: Mapping[str, str], cwd: Path) -> None:
    """Raise what Popen would (FileNotFoundError, PermissionError) when `program` cannot be run:
    behind setpriv, Popen itself always finds its program, and setpriv's exit code 127 would say
    less. Looked up as execvpe does: a path relative to the command's cwd, else along env's PATH."""
    if os.sep in program:
        path = cwd / program
        if not path.exists():
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
        if path.is_dir() or not os.access(path, os.X_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), program)
        return
    if shutil.which(program, path=os.pathsep.join(os.get_exec_path(dict(env)))) is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)


def spawn(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, pipes: bool = False
) -> subprocess.Popen[bytes]:
    """Start the user's command in a process group of its own, with the parent-death signal (module
    docstring); `pipes`: its stdin and stdout are pipes to us (a persistent command's protocol
    channel), else stdin is /dev/null and stdout the worker's. Call from the thread that owns the
    process until it ends (a slot's thread: `runtime.run_slots`): the parent-death signal fires when
    the starting thread exits. A command that cannot be started is a COMMAND_NOT_FOUND CommandFailure."""
    if not argv:
        raise CommandFailure(ErrorClass.COMMAND_NOT_FOUND, "spec.worker.command is empty")
    stdin = subprocess.PIPE if pipes else subprocess.DEVNULL
    stdout = subprocess.PIPE if pipes else None
    try:
        if _SETPRIV:
            check_executable(argv[0], env, cwd)
            return subprocess.Popen(
                [_SETPRIV, "--pdeathsig", "KILL", "--", *argv],
                env=dict(env),
                cwd=cwd,
                stdin=stdin,
                stdout=stdout,
                bufsize=0,
                process_group=0,
            )
        return subprocess.Popen(
            list(argv),
            env=dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            bufsize=0,
            process_group=0,
            # Without setpriv only: a preexec_fn is unsafe while other threads run (the watches, other
            # slots); setpriv, which every worker image has (util-linux), is the path taken there.
            preexec_fn=_parent_death_signal,  # noqa: PLW1509
        )
    except FileNotFoundError as error:
        raise CommandFailure(
            ErrorClass.COMMAND_NOT_FOUND,
            f"command not found: {argv[0]!r} ({error.strerror}); check spec.worker.command "
            "and that the program is installed in the worker image",
        ) from None
    except PermissionError as error:
        raise CommandFailure(
            ErrorClass.COMMAND_NOT_FOUND,
            f"command cannot be executed: {argv[0]!r} ({error.strerror})",
        ) from None
    except OSError as error:
        raise CommandFailure(
            ErrorClass.COMMAND_NOT_FOUND, f"command could not start: {argv[0]!r} ({error})"
        ) from None


class ShardCommand(Protocol):
    """One shard's run of the user's command, as the runtime drives it: a Command (a process of its
    own) or a ServedCommand (a turn of a persistent command's process)."""

    # Stopped by us (terminate, or kill while it ran): a last result line cut short is no error.
    signalled: bool
    # start() started a process (shardops_worker_command_starts_total).
    new_process: bool

    @property
    def pid(self) -> int | None: ...

    def start(self) -> None: ...

    def poll(self) -> int | None: ...

    def seconds(self) -> float | None: ...

    def wait(self, seconds: float) -> None:
        """Block up to `seconds`, returning as soon as the command may have ended (its exit, its
        answer), so the worker sees the end at once instead of at its next tick."""
        ...

    def terminate(self, grace: float, wait: Callable[[float], object] = time.sleep) -> int | None: ...

    def kill(self) -> int | None: ...


def pidfd_of(pid: int) -> int | None:
    """A file descriptor that turns readable when process `pid` ends (Linux 5.3+); None where there
    is none (the caller then sleeps its tick)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_fd(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def wait_readable(fds: Iterable[int], seconds: float) -> None:
    """Until one of `fds` is readable (or hung up), or `seconds` pass; a sleep without any."""
    if seconds <= 0:
        return
    watched = list(fds)
    if not watched:
        time.sleep(seconds)
        return
    poller = select.poll()
    for fd in watched:
        poller.register(fd, select.POLLIN)
    poller.poll(seconds * 1000)


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


def _kill_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the group `popen` leads (strays included) and reap the leader."""
    _signal_group(popen, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=10)


def _wait_for_exit(popen: subprocess.Popen[bytes], grace: float, wait: Callable[[float], object]) -> None:
    """Give the process `grace` seconds to exit (polled every 50 ms through `wait`)."""
    deadline = time.monotonic() + grace
    while popen.poll() is None and time.monotonic() < deadline:
        wait(0.05)


def _ask_group_to_stop(popen: subprocess.Popen[bytes], grace: float, wait: Callable[[float], object]) -> None:
    """SIGTERM the group `popen` leads and give the leader `grace` seconds to exit."""
    if popen.poll() is None:
        _signal_group(popen, signal.SIGTERM)
        _wait_for_exit(popen, grace, wait)


def exit_code(returncode: int) -> int:
    """A process's exit code as a shell shows it: killed by signal n reads 128+n."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass
class Command:
    """The user's command as one process group, started for one shard."""

    argv: Sequence[str]
    env: Mapping[str, str]
    cwd: Path
    popen: subprocess.Popen[bytes] | None = None
    signalled: bool = False
    new_process: bool = False
    started_at: float = field(default=0.0)
    # When the exit was first seen (poll or kill), on the monotonic clock of started_at.
    ended_at: float | None = None
    # Readable once the process ends (`wait`); closed once its end is seen.
    pidfd: int | None = None

    def start(self) -> None:
        self.popen = spawn(self.argv, self.env, self.cwd)
        self.new_process = True
        self.started_at = time.monotonic()
        self.pidfd = pidfd_of(self.popen.pid)

    def wait(self, seconds: float) -> None:
        if self.popen is None or self.ended_at is not None:
            return
        wait_readable([self.pidfd] if self.pidfd is not None else [], seconds)

    def _ended(self) -> None:
        if self.ended_at is None:
            self.ended_at = time.monotonic()
        close_fd(self.pidfd)
        self.pidfd = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def poll(self) -> int | None:
        """The exit code once the command has ended (a signal n shows as 128+n, as in a shell)."""
        if self.popen is None:
            return None
        code = self.popen.poll()
        if code is None:
            return None
        self._ended()
        return exit_code(code)

    def seconds(self) -> float | None:
        """How long the command ran (so far, while it runs); None when it never started."""
        if self.popen is None:
            return None
        end = self.ended_at if self.ended_at is not None else time.monotonic()
        return end - self.started_at

    def terminate(self, grace: float, wait: Callable[[float], object] = time.sleep) -> int | None:
        """SIGTERM to the group, SIGKILL after `grace` seconds; returns the exit code."""
        if self.popen is None:
            return None
        self.signalled = True
        _ask_group_to_stop(self.popen, grace, wait)
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL whatever is left of the group (strays included) and reap the command."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.signalled = True
        _kill_group(self.popen)
        code = self.poll()
        self._ended()
        return code


# --- persistent commands (docs/architecture.md, "Persistent commands") ------------------------------

# In a persistent command's environment from its start: it reads its shards' requests from stdin.
PERSISTENT_ENV = "SHARDOPS_PERSISTENT"
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
        _kill_group(self.popen)
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
        _wait_for_exit(process.popen, grace, wait)
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
        snippet = line[:_SNIPPET].decode("utf-8", errors="replace")
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
        _ask_group_to_stop(self.process.popen, grace, wait)
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


def command_env(
    inherited: Mapping[str, str],
    protocol: Mapping[str, str],
    declared: Mapping[str, str],
) -> dict[str, str]:
    """The command's environment: the worker's own minus its API credentials, then the protocol
    variables, then spec.worker.env (the user's word is last, as in a pod spec)."""
    env = {k: v for k, v in inherited.items() if k != "KUBECONFIG"}
    env.update(protocol)
    env.update(declared)
    return env
