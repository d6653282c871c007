"""shardops-example-agent: a stand-in for an LLM call, for demos and tests of the worker runtime.

It speaks the worker protocol of docs/architecture.md: it reads the shard's remaining items from
$SHARDOPS_ITEMS_FILE (JSONL `{"key", "index", "item"}`), "calls" $SHARDOPS_SOURCE for each one
(sleeps for the latency), and appends `{"key", "result", "cost"}` to $SHARDOPS_RESULTS_FILE, one
line per item as soon as it is done. Failures follow the protocol too: a structured error file
($SHARDOPS_ERROR_FILE: class, source, message) and exit 75 for retryable classes.

Behaviour is set by environment variables (for the whole run) and by item fields (per item):

| variable | effect |
| --- | --- |
| SHARDOPS_AGENT_LATENCY | seconds per item (default 0.05) |
| SHARDOPS_AGENT_COST | cost reported per item (default 0.01) |
| SHARDOPS_AGENT_RATE_LIMITED_SOURCES | comma list: calls to these sources answer 429 (rate-limited) |
| SHARDOPS_AGENT_TIMEOUT_SOURCES | comma list: calls to these sources time out |
| SHARDOPS_AGENT_CRASH_AFTER | N: the process is killed (SIGKILL) after N items |
| SHARDOPS_AGENT_HANG_AFTER | N: after N items it hangs without progress until signalled |
| SHARDOPS_AGENT_FAULT_ATTEMPTS | comma list of attempts the variables above apply to (default: all) |
| SHARDOPS_AGENT_LEDGER | file: one JSON line per item started and finished, for counting calls |

| item field | effect |
| --- | --- |
| latency, cost | override the run's values for this item |
| fault | rate-limited, timeout, invalid (non-retryable), hang, crash, garbage, big |
| faultAttempts | list of attempts the item's fault applies to (default: all) |

`invalid` is a non-retryable invalid input, `garbage` writes an unreadable result line, `big` pads
the result to the item's `bytes` field (default 1 MiB).

SIGTERM ends the run between two writes (exit 143): every result line already written is whole.

With SHARDOPS_PERSISTENT=1 (spec.worker.persistent) one process serves shard after shard: it reads
one request line `{"shard": name, "env": {...}}` from stdin, runs that shard with its environment
at start plus the request's env (the variables above included, so a fault applies to the shards
whose env sets it), answers `{"shard": name, "exit": code}` on stdout with the code a run of its
own would have exited with, and ends with 0 at the end of input. A crash kills the process
mid-shard, as it would kill a run of its own; SIGTERM ends the process (exit 143).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any, NamedTuple, NoReturn

EXIT_TEMPFAIL = 75
EXIT_DATAERR = 65
EXIT_SIGTERM = 128 + signal.SIGTERM
EXIT_USAGE = 2
PERSISTENT_ENV = "SHARDOPS_PERSISTENT"


class Stop(Exception):
    """Raised to end the run with an exit code after the error file is written."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Terminated(Exception):
    """SIGTERM: the run ends between two writes, and a persistent process with it."""


# NamedTuples, not dataclasses: importing dataclasses (and inspect with it) costs ~10 ms at every
# start, and a worker starts this command once per shard.
class Settings(NamedTuple):
    latency: float
    cost: float
    rate_limited_sources: frozenset[str]
    timeout_sources: frozenset[str]
    crash_after: int | None
    hang_after: int | None
    fault_attempts: frozenset[int] | None
    ledger: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        return cls(
            latency=float(env.get("SHARDOPS_AGENT_LATENCY", "0.05")),
            cost=float(env.get("SHARDOPS_AGENT_COST", "0.01")),
            rate_limited_sources=_names(env.get("SHARDOPS_AGENT_RATE_LIMITED_SOURCES")),
            timeout_sources=_names(env.get("SHARDOPS_AGENT_TIMEOUT_SOURCES")),
            crash_after=_optional_int(env.get("SHARDOPS_AGENT_CRASH_AFTER")),
            hang_after=_optional_int(env.get("SHARDOPS_AGENT_HANG_AFTER")),
            fault_attempts=_attempts(env.get("SHARDOPS_AGENT_FAULT_ATTEMPTS")),
            ledger=env.get("SHARDOPS_AGENT_LEDGER") or None,
        )


def _names(value: str | None) -> frozenset[str]:
    return frozenset(part.strip() for part in (value or "").split(",") if part.strip())


def _optional_int(value: str | None) -> int | None:
    return int(value) if value not in (None, "") else None


def _attempts(value: str | None) -> frozenset[int] | None:
    names = _names(value)
    return frozenset(int(n) for n in names) if names else None


class Context(NamedTuple):
    items_file: str
    results_file: str
    error_file: str
    source: str
    shard: str
    attempt: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Context:
        return cls(
            items_file=env["SHARDOPS_ITEMS_FILE"],
            results_file=env["SHARDOPS_RESULTS_FILE"],
            error_file=env["SHARDOPS_ERROR_FILE"],
            source=env.get("SHARDOPS_SOURCE", ""),
            shard=env.get("SHARDOPS_SHARD", ""),
            attempt=int(env.get("SHARDOPS_ATTEMPT", "1")),
        )


def answer(item: Any) -> str:
    """Deterministic per item, so two runs of the same item agree (as an idempotent call should)."""
    text = json.dumps(item, sort_keys=True, separators=(",", ":"))
    return "answer-" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _append_line(path: str, record: Mapping[str, Any] | str) -> None:
    # One write() on an O_APPEND descriptor: concurrent writers never interleave within a line, and
    # a reader never sees half a line from a process that is still alive.
    text = record if isinstance(record, str) else json.dumps(record, separators=(",", ":"))
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def _fail(ctx: Context, error_class: str, message: str, code: int) -> NoReturn:
    with open(ctx.error_file, "w", encoding="utf-8") as handle:
        json.dump({"class": error_class, "source": ctx.source or None, "message": message}, handle)
    raise Stop(code)


def _hang() -> NoReturn:
    # "Hang without progress": alive, heartbeats continue in the worker, but no result appears.
    while True:
        time.sleep(3600)


def _item_fault(entry: Mapping[str, Any], attempt: int) -> str | None:
    item = entry.get("item")
    if not isinstance(item, dict) or not item.get("fault"):
        return None
    only = item.get("faultAttempts")
    if isinstance(only, list) and attempt not in only:
        return None
    return str(item["fault"])


class Agent:
    def __init__(self, settings: Settings, ctx: Context) -> None:
        self.settings = settings
        self.ctx = ctx
        self.done = 0
        self.env_faults = settings.fault_attempts is None or ctx.attempt in settings.fault_attempts

    def _source_name(self) -> str:
        return f"source {self.ctx.source}" if self.ctx.source else "the default source"

    def ledger(self, event: str, entry: Mapping[str, Any]) -> None:
        if self.settings.ledger:
            _append_line(
                self.settings.ledger,
                {
                    "event": event,
                    "shard": self.ctx.shard,
                    "attempt": self.ctx.attempt,
                    "index": entry.get("index"),
                    "key": entry.get("key"),
                    "pid": os.getpid(),
                    # The worker pod that ran it (its env reaches the command): slots of one pod share it.
                    "pod": os.environ.get("POD_NAME"),
                    "at": time.time(),
                },
            )

    def run(self) -> int:
        with open(self.ctx.items_file, encoding="utf-8") as handle:
            entries = [json.loads(line) for line in handle if line.strip()]
        for entry in entries:
            self.before_item()
            self.process(entry)
        return 0

    def before_item(self) -> None:
        s = self.settings
        if not self.env_faults:
            return
        if s.crash_after is not None and self.done >= s.crash_after:
            os.kill(os.getpid(), signal.SIGKILL)
        if s.hang_after is not None and self.done >= s.hang_after:
            _hang()
        if self.ctx.source in s.rate_limited_sources:
            _fail(
                self.ctx,
                "rate-limited",
                f"429 Too Many Requests from {self._source_name()}",
                EXIT_TEMPFAIL,
            )
        if self.ctx.source in s.timeout_sources:
            _fail(self.ctx, "timeout", f"{self._source_name()} did not answer in time", EXIT_TEMPFAIL)

    def process(self, entry: Mapping[str, Any]) -> None:
        item = entry.get("item")
        fields = item if isinstance(item, dict) else {}
        fault = _item_fault(entry, self.ctx.attempt)
        self.ledger("start", entry)
        if fault == "rate-limited":
            _fail(
                self.ctx,
                "rate-limited",
                f"429 Too Many Requests from {self._source_name()}",
                EXIT_TEMPFAIL,
            )
        if fault == "timeout":
            _fail(self.ctx, "timeout", f"{self._source_name()} did not answer in time", EXIT_TEMPFAIL)
        if fault == "invalid":
            _fail(
                self.ctx, "invalid-input", f"item {entry.get('index')} is not a valid request", EXIT_DATAERR
            )
        if fault == "hang":
            _hang()
        if fault == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(float(fields.get("latency", self.settings.latency)))
        if fault == "garbage":
            _append_line(self.ctx.results_file, "this is not JSON {")
            self.ledger("garbage", entry)
            self.done += 1
            return
        result: dict[str, Any] = {
            "answer": answer(item),
            "attempt": self.ctx.attempt,
            "source": self.ctx.source or None,
        }
        if fault == "big":
            result["padding"] = "x" * int(fields.get("bytes", 1024 * 1024))
        cost = float(fields.get("cost", self.settings.cost))
        _append_line(self.ctx.results_file, {"key": entry["key"], "result": result, "cost": cost})
        self.ledger("done", entry)
        self.done += 1


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated


def run_shard(env: Mapping[str, str]) -> int:
    """One shard, with the protocol's variables in `env`: the code its run ends with."""
    try:
        settings = Settings.from_env(env)
        ctx = Context.from_env(env)
    except (KeyError, ValueError) as error:
        print(f"shardops-example-agent: bad environment: {error!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return Agent(settings, ctx).run()
    except Stop as stop:
        return stop.code


def serve(env: Mapping[str, str]) -> int:
    """Shard after shard, one request line each from stdin, until the end of input."""
    for line in iter(sys.stdin.readline, ""):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            shard_env = {**env, **request["env"]}
        except (ValueError, KeyError, TypeError) as error:
            print(f"shardops-example-agent: bad request line {line[:80]!r}: {error!r}", file=sys.stderr)
            return EXIT_USAGE
        code = run_shard(shard_env)
        sys.stdout.write(json.dumps({"shard": request.get("shard"), "exit": code}) + "\n")
        sys.stdout.flush()
    return 0


def main() -> int:
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        if os.environ.get(PERSISTENT_ENV) == "1":
            return serve(dict(os.environ))
        return run_shard(os.environ)
    except Terminated:
        return EXIT_SIGTERM


if __name__ == "__main__":
    sys.exit(main())
