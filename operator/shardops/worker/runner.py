"""Running the user's command for one attempt: files, environment, process group, signals, and
reading results.

A command runs once per shard (Command), or, with spec.worker.persistent, as one process serving
shard after shard (persistent.py: ServedCommand over a CommandServer's ServedProcess). The runtime
drives both the same way (ShardCommand). The command's environment is built by `command_env` (the
worker's own, then the protocol variables: `campaign_variables`, `SHARD_VARIABLES`, then
spec.worker.env).

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
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from shardops.api.campaign import Campaign
from shardops.api.common import NO_TOKENS, TokenCounts
from shardops.api.enums import ErrorClass
from shardops.api.item_errors import errored_result, item_error_problem
from shardops.api.money import JsonNumber, parse_money
from shardops.api.worker import WorkerSpec
from shardops.logic.idempotency import canonical_json

ITEMS_FILE = "items.jsonl"
RESULTS_FILE = "results.jsonl"
# The finalize shard's extra input: every finished item of the campaign (SHARDOPS_CAMPAIGN_RESULTS_FILE).
CAMPAIGN_RESULTS_FILE = "campaign-results.jsonl"
ERROR_FILE = "error.json"
# The cooldown of the shard's source, for the built-in LLM worker (its variable: COOLDOWN_FILE_ENV):
# JSON {source, until: epoch seconds, shard} or {}, rewritten at each heartbeat (state/cooldowns.py).
COOLDOWN_FILE = "cooldown.json"
# The protocol variables every shard's command gets with values of its own, in this order (a
# finalize shard and a shard of the built-in LLM worker get one more each: `ShardRun.run_command`).
SHARD_VARIABLES = (
    "SHARDOPS_ITEMS_FILE",
    "SHARDOPS_RESULTS_FILE",
    "SHARDOPS_ERROR_FILE",
    "SHARDOPS_SOURCE",
    "SHARDOPS_SHARD",
    "SHARDOPS_ATTEMPT",
    "SHARDOPS_IDEMPOTENCY_KEY",
)
_PR_SET_PDEATHSIG = 1
# Resolved once: the launcher that sets the parent-death signal; None falls back to a preexec_fn.
_SETPRIV = shutil.which("setpriv")
SNIPPET = 80
# A longer error file is not a structured error any more; its message is cut later anyway.
_ERROR_FILE_MAX = 64 * 1024


def campaign_variables(campaign: Campaign, worker_spec: WorkerSpec) -> dict[str, str]:
    """The protocol variables every shard of `campaign` run by `worker_spec` gets the same."""
    shares = campaign.current_status.source_shares
    return {"SHARDOPS_CAMPAIGN": campaign.name, **campaign.spec.command_settings(worker_spec, shares)}


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
    cost: Decimal
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

    Every line must be `{"key": <a remaining sub-key>, "result": <JSON>, "cost": <decimal ≥ 0>?,
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
        snippet = raw[:SNIPPET].decode("utf-8", errors="replace")
        try:
            # The cost is read from the number's text (0.1 is exactly 0.1); the result's floats stay floats.
            value = json.loads(raw, parse_float=JsonNumber)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            detail = error.msg if isinstance(error, json.JSONDecodeError) else "not UTF-8"
            raise bad_output(f"{where} is not valid JSON ({detail}): {snippet!r}") from None
        if not isinstance(value, dict):
            raise bad_output(f"{where} must be a JSON object with key and result, got: {snippet!r}")
        key = value.get("key")
        if not isinstance(key, str) or key not in self.expected:
            raise bad_output(f"{where}: key {key!r} is not one of this attempt's items: {snippet!r}")
        result = value.get("result")
        if "error" in value:
            # The item failed on its own (api/item_errors.py): its error is its result, the shard goes on.
            problem = item_error_problem(value["error"])
            if problem is not None:
                raise bad_output(f"{where}: key {key}: {problem}: {snippet!r}")
            reported = value["error"]
            result = errored_result(
                ErrorClass(reported["class"]), reported["message"], reported.get("code"), result
            )
        elif "result" not in value:
            raise bad_output(f"{where}: no result (nor error) for key {key}: {snippet!r}")
        try:
            canonical_json(result)
        except (TypeError, ValueError) as error:
            raise bad_output(f"{where}: result for key {key} has no exact JSON form ({error})") from None
        try:
            cost = parse_money(value.get("cost", 0))
        except ValueError:
            wrong = f"got {value['cost']!r}"
            raise bad_output(f"{where}: cost must be a number >= 0 (or a decimal string), {wrong}") from None
        return ResultLine(key, result, cost, _tokens(value.get("tokens"), where, snippet))


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
    process until it ends (a slot's thread: `slots.run_slots`): the parent-death signal fires when
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


def kill_group(popen: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the group `popen` leads (strays included) and reap the leader."""
    _signal_group(popen, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        popen.wait(timeout=10)


def wait_for_exit(popen: subprocess.Popen[bytes], grace: float, wait: Callable[[float], object]) -> None:
    """Give the process `grace` seconds to exit (polled every 50 ms through `wait`)."""
    deadline = time.monotonic() + grace
    while popen.poll() is None and time.monotonic() < deadline:
        wait(0.05)


def ask_group_to_stop(popen: subprocess.Popen[bytes], grace: float, wait: Callable[[float], object]) -> None:
    """SIGTERM the group `popen` leads and give the leader `grace` seconds to exit."""
    if popen.poll() is None:
        _signal_group(popen, signal.SIGTERM)
        wait_for_exit(popen, grace, wait)


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
        ask_group_to_stop(self.popen, grace, wait)
        return self.kill()

    def kill(self) -> int | None:
        """SIGKILL whatever is left of the group (strays included) and reap the command."""
        if self.popen is None:
            return None
        if self.popen.poll() is None:
            self.signalled = True
        kill_group(self.popen)
        code = self.poll()
        self._ended()
        return code


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
