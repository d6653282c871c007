"""Persistent commands (spec.worker.persistent): one process serving shard after shard.

First the runner on its own (ServedCommand over a CommandServer, with small stand-in commands), then
the worker loop against the in-memory API server with the example agent, where every outcome must be
the one a process started per shard gives.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from shardops.api.enums import ErrorClass
from shardops.api.shard import Shard
from shardops.k8s.api import LEASES, SHARDS, Resource
from shardops.store.configmap import ConfigMapStore
from shardops.worker import runner
from shardops.worker.holding import Outcome
from shardops.worker.persistent import PERSISTENT_ENV, CommandServer, ServedCommand
from shardops.worker.runner import CommandFailure
from tests import workerkit
from tests.fakekube import FakeKube
from tests.workerkit import NAMESPACE, add_campaign, campaign_body

AGENT = [sys.executable, "-m", "shardops_example_agent.agent"]

# A stand-in persistent command: per request, what its env's DO says (answer CODE by default).
_SERVE = """
import json, os, sys, time
for line in iter(sys.stdin.readline, ""):
    request = json.loads(line)
    env = request["env"]
    do = env.get("DO", "answer")
    if do == "crash":
        os.kill(os.getpid(), 9)
    if do == "exit":
        sys.exit(int(env["CODE"]))
    if do == "say":
        sys.stdout.write(env["SAY"] * int(env.get("TIMES", "1")))
        sys.stdout.flush()
        continue
    if do == "hang":
        time.sleep(600)
    print(json.dumps({"shard": request["shard"], "exit": int(env.get("CODE", "0"))}), flush=True)
"""
SERVE = [sys.executable, "-c", _SERVE]
# Reads one request and answers it (exit 0), then does what follows.
ANSWER_ONCE = (
    "import json, sys, time\n"
    "shard = json.loads(sys.stdin.readline())['shard']\n"
    "print(json.dumps({'shard': shard, 'exit': 0}), flush=True)\n"
)


def _until(what: str, check: Callable[[], object], seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[CommandServer]:
    served = CommandServer(tmp_path / "work")
    yield served
    served.close(grace=0)


def _turn(
    server: CommandServer,
    shard: str = "s",
    argv: list[str] = SERVE,
    env: dict[str, str] | None = None,
    **of_shard: str,
) -> ServedCommand:
    """One shard's turn, started: `env` the campaign's variables, `of_shard` the shard's own."""
    command = ServedCommand(
        server, argv, {**os.environ, **(env or {}), **of_shard}, frozenset(of_shard), shard
    )
    command.start()
    return command


def _code(command: ServedCommand) -> int:
    _until("the shard's exit code", lambda: command.poll() is not None)
    code = command.poll()
    assert code is not None
    return code


# --- the runner -------------------------------------------------------------------------------------


def test_the_process_starts_with_the_campaigns_env_and_gets_each_shards_own_with_its_request(
    server: CommandServer, tmp_path: Path
) -> None:
    record = tmp_path / "record.jsonl"
    script = (
        "import json, os, sys\n"
        f"out = open({str(record)!r}, 'a')\n"
        "out.write(json.dumps(dict(os.environ)) + '\\n'); out.flush()\n"
        "for line in iter(sys.stdin.readline, ''):\n"
        "    out.write(line); out.flush()\n"
        "    print(json.dumps({'shard': json.loads(line)['shard'], 'exit': 0}), flush=True)\n"
    )
    argv = [sys.executable, "-c", script]
    for shard in ("s1", "s2"):
        command = _turn(server, shard, argv, {"MODEL": "m"}, SHARDOPS_SHARD=shard, SHARDOPS_ATTEMPT="1")
        assert _code(command) == 0
    start, *requests = [json.loads(line) for line in record.read_text().splitlines()]
    assert start[PERSISTENT_ENV] == "1" and start["MODEL"] == "m"
    assert "SHARDOPS_SHARD" not in start and "SHARDOPS_ATTEMPT" not in start
    assert requests == [
        {"shard": "s1", "env": {"SHARDOPS_SHARD": "s1", "SHARDOPS_ATTEMPT": "1"}},
        {"shard": "s2", "env": {"SHARDOPS_SHARD": "s2", "SHARDOPS_ATTEMPT": "1"}},
    ]


def test_one_process_serves_shard_after_shard_until_the_campaigns_env_changes(server: CommandServer) -> None:
    # One at a time, as the worker runs them: each answer before the next request.
    turns = []
    for n, code in enumerate((0, 75, 65)):
        turn = _turn(server, f"s{n}", CODE=str(code))
        assert _code(turn) == code
        turn.kill()  # what the runtime does after every shard: the answered process stays
        turns.append(turn)
    assert [t.new_process for t in turns] == [True, False, False]
    assert len({t.pid for t in turns}) == 1
    assert all(not t.signalled for t in turns) and not workerkit.process_gone(turns[0].pid or 0)
    other = _turn(server, "s3", env={"MODEL": "other"})
    assert _code(other) == 0
    assert other.new_process and other.replaced == "the next shard's command or environment differs"
    assert other.pid != turns[0].pid
    _until("the replaced process to end", lambda: workerkit.process_gone(turns[0].pid or 0))


def test_a_wait_ends_at_the_answer_or_the_processs_end_not_at_its_timeout(server: CommandServer) -> None:
    answered = _turn(server, "s0")
    began = time.monotonic()
    while answered.poll() is None:
        answered.wait(30)
        assert time.monotonic() - began < 20, "the wait ran to its timeout, not to the answer"
    assert answered.poll() == 0
    answered.kill()
    crashed = _turn(server, "s1", DO="crash")
    began = time.monotonic()
    while crashed.poll() is None:
        crashed.wait(30)
        assert time.monotonic() - began < 20, "the wait ran to its timeout, not to the end"
    assert crashed.poll() == 128 + signal.SIGKILL
    hanging = _turn(server, "s2", DO="hang")
    began = time.monotonic()
    hanging.wait(0.2)
    assert time.monotonic() - began >= 0.2 and hanging.poll() is None


@pytest.mark.parametrize(
    ("said", "message"),
    [
        ("hello\n", 'must be one line {"shard": "s", "exit": <0-255>}, got: \'hello\''),
        ('{"shard": "s", "exit": "0"}\n', "must be one line"),
        ('{"shard": "s", "exit": 300}\n', "must be one line"),
        ('{"shard": "s", "exit": true}\n', "must be one line"),
        ('{"exit": 0}\n', "must be one line"),
        ('{"shard": "another", "exit": 0}\n', "must be one line"),
        ("x", "over 65536 bytes to stdout for shard s without a newline"),
    ],
)
def test_a_malformed_answer_is_bad_output_and_the_process_goes(
    server: CommandServer, said: str, message: str
) -> None:
    command = _turn(server, DO="say", SAY=said, TIMES="1" if said.endswith("\n") else "70000")
    with pytest.raises(CommandFailure, match=re.escape(message)) as failure:
        _until("the answer", command.poll)
    assert failure.value.error_class is ErrorClass.BAD_OUTPUT
    if said.endswith("\n"):
        assert "write logs to stderr" in failure.value.message
    pid = command.pid
    assert pid is not None
    command.kill()  # the runtime's answer to a CommandFailure
    assert workerkit.process_gone(pid) and command.signalled and server.process is None
    assert _turn(server, "next").new_process


@pytest.mark.parametrize(("do", "code"), [("crash", 128 + signal.SIGKILL), ("exit", 3), ("exit", 0)])
def test_a_process_that_ends_mid_shard_gives_its_exit_code_and_the_next_shard_a_new_process(
    server: CommandServer, do: str, code: int
) -> None:
    first = _turn(server, "s1")
    assert _code(first) == 0
    first.kill()
    ended = _turn(server, "s2", DO=do, CODE=str(code))
    assert not ended.new_process and _code(ended) == code and not ended.answered
    ended.kill()
    assert not ended.signalled, "it ended by itself"
    after = _turn(server, "s3")
    assert after.new_process and after.pid != first.pid and _code(after) == 0


def test_a_process_that_ended_between_shards_is_replaced(server: CommandServer) -> None:
    first = _turn(server, "s1")
    assert _code(first) == 0
    first.kill()
    pid = first.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _until(
        "the process to end", lambda: server.process is not None and server.process.popen.poll() is not None
    )
    after = _turn(server, "s2")
    assert after.new_process and after.replaced == f"it ended between shards (exit {128 + signal.SIGKILL})"
    assert _code(after) == 0


def test_output_between_shards_replaces_the_process(server: CommandServer, tmp_path: Path) -> None:
    # Answers, then writes one more line: its next line would pass for the next shard's answer.
    script = (
        "import sys\n"
        "sys.stdin.readline()\n"
        'print(\'{"shard": "s1", "exit": 0}\\n{"shard": "s1", "exit": 0}\', flush=True)\n'
        "sys.stdin.readline()\n"
    )
    first = _turn(server, "s1", [sys.executable, "-c", script])
    assert _code(first) == 0
    first.kill()
    after = _turn(server, "s2", [sys.executable, "-c", script])
    assert after.new_process and after.replaced == "it wrote to stdout between shards"
    assert after.pid != first.pid and workerkit.process_gone(first.pid or 0)


def test_terminate_before_the_answer_ends_the_whole_group(server: CommandServer, tmp_path: Path) -> None:
    marker = tmp_path / "grandchild.pid"
    # Starts a grandchild that ignores SIGTERM, then hangs in the shard: only the group SIGKILL ends it.
    script = (
        "import subprocess, sys, time\n"
        "sys.stdin.readline()\n"
        "p = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"open({str(marker)!r}, 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    command = _turn(server, "s1", [sys.executable, "-c", script])
    _until("the grandchild", lambda: marker.exists() and marker.read_text())
    grandchild = int(marker.read_text())
    assert command.poll() is None
    assert command.terminate(grace=0.5) == 128 + signal.SIGTERM
    assert command.signalled and server.process is None
    _until("the grandchild to end", lambda: workerkit.process_gone(grandchild))
    assert _turn(server, "s2").new_process


def test_stopping_after_the_answer_leaves_the_process_to_the_next_shard(server: CommandServer) -> None:
    command = _turn(server, "s1", CODE="75")
    assert _code(command) == 75
    assert command.terminate(grace=0.5) == 75 and command.kill() == 75
    assert (
        not command.signalled and server.process is not None and not workerkit.process_gone(command.pid or 0)
    )
    assert not _turn(server, "s2").new_process


def test_close_asks_with_end_of_input_then_kills_the_group(tmp_path: Path) -> None:
    served = CommandServer(tmp_path / "work")
    command = _turn(served, "s1")
    assert _code(command) == 0
    process = served.process
    assert process is not None and process.directory.is_dir()
    served.close(grace=10)
    assert process.popen.returncode == 0, "it read the end of input and exited by itself"
    assert not process.directory.exists() and served.process is None
    # One that ignores the end of input is killed after the grace.
    deaf = [
        sys.executable,
        "-c",
        ANSWER_ONCE + "time.sleep(60)",
    ]
    command = _turn(served, "s2", deaf)
    assert _code(command) == 0
    process = served.process
    assert process is not None
    started = time.monotonic()
    served.close(grace=0.2)
    assert time.monotonic() - started < 5 and process.popen.returncode == -signal.SIGKILL


def test_a_request_too_long_for_the_pipe_is_a_failure_of_its_own(server: CommandServer) -> None:
    with pytest.raises(CommandFailure, match="does not fit in a persistent command's stdin pipe") as failure:
        _turn(server, "s1", HUGE="x" * 70_000)
    assert failure.value.error_class is ErrorClass.UNKNOWN and server.process is None


def test_a_command_that_cannot_start_is_command_not_found(server: CommandServer) -> None:
    with pytest.raises(CommandFailure, match="command not found: 'no-such-program-xyz'") as failure:
        _turn(server, "s1", ["no-such-program-xyz"])
    assert failure.value.error_class is ErrorClass.COMMAND_NOT_FOUND
    assert server.process is None
    assert not any((server.base or Path("/nonexistent")).iterdir()), "its directory is removed"


_SERVED_PARENT = """
import os, sys, time
from pathlib import Path
from shardops.worker import persistent, runner
if sys.argv[1] == "preexec":
    runner._SETPRIV = None
server = persistent.CommandServer(Path(sys.argv[2]))
argv = [sys.executable, "-c", sys.argv[3]]
command = persistent.ServedCommand(server, argv, dict(os.environ), frozenset(), "s")
command.start()
while command.poll() is None:
    time.sleep(0.01)
print(command.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("launcher", ["setpriv", "preexec"])
def test_a_persistent_command_dies_with_its_worker(launcher: str, tmp_path: Path) -> None:
    if launcher == "setpriv" and runner._SETPRIV is None:
        pytest.skip("setpriv is not installed")
    # The command answers, then sleeps: it never reads again, so no end of input would end it either.
    child_code = ANSWER_ONCE + "time.sleep(600)"
    parent = subprocess.Popen(
        [sys.executable, "-c", _SERVED_PARENT, launcher, str(tmp_path), child_code],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    # Printed once it answered: past setpriv's prctl, so the signal is armed.
    child = int(parent.stdout.readline())
    assert not workerkit.process_gone(child)
    parent.kill()
    parent.wait()
    _until(f"command {child} to die with its worker ({launcher})", lambda: workerkit.process_gone(child))


# --- the worker loop --------------------------------------------------------------------------------


def _campaign(items: list[dict[str, Any]], persistent: bool, **spec: Any) -> dict[str, Any]:
    env = {"SHARDOPS_AGENT_LATENCY": "0", **spec.pop("env", {})}
    worker = {
        "image": "x",
        "command": spec.pop("command", AGENT),
        "env": [{"name": k, "value": v} for k, v in env.items()],
        **({"persistent": True} if persistent else {}),
    }
    return campaign_body(items=items, worker=worker, **spec)


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _shard(kube: FakeKube, name: str) -> Shard:
    found = kube.obj(SHARDS, NAMESPACE, name)
    assert found is not None
    return Shard.parse(found)


def _outcome(kube: FakeKube, shard: Shard) -> tuple[str, str | None, str | None]:
    status = _shard(kube, shard.name).current_status
    error = status.last_error
    return str(status.phase), error and str(error.error_class), error and error.message


def _stored(kube: FakeKube, shard: Shard) -> list[Any]:
    stored = ConfigMapStore(kube, NAMESPACE).read_result(shard.spec.idempotency_key)  # type: ignore[arg-type]
    assert stored is not None
    return [(e["key"], e["result"]) for e in json.loads(stored.text)["items"]]


def _starts(worker: Any, mode: str) -> float:
    return float(worker.metrics.sample("shardops_worker_command_starts_total", mode=mode))


def test_one_process_serves_every_shard_with_the_results_of_a_process_per_shard(tmp_path: Path) -> None:
    items = [{"id": i, "cost": 0.5 + i} for i in range(6)]
    results, pids = {}, {}
    for persistent in (False, True):
        kube = FakeKube()
        ledger = tmp_path / f"ledger-{persistent}.jsonl"
        shards = add_campaign(kube, _campaign(items, persistent, env={"SHARDOPS_AGENT_LEDGER": str(ledger)}))
        work_dir = tmp_path / f"work-{persistent}"
        worker = workerkit.worker(kube, work_dir)
        assert worker.run() == 0
        assert {_outcome(kube, s) for s in shards} == {("Done", None, None)}
        results[persistent] = {
            s.name: (_stored(kube, s), _shard(kube, s.name).current_status.cost) for s in shards
        }
        pids[persistent] = {e["pid"] for e in _ledger(ledger) if e["event"] == "done"}
        mode = "persistent" if persistent else "per-shard"
        assert _starts(worker, mode) == len(pids[persistent])
        assert list(work_dir.iterdir()) == [], "attempt directories and the process's own are removed"
    assert results[True] == results[False]
    assert len(pids[False]) == 3 and len(pids[True]) == 1, "one process served the three shards"
    assert all(workerkit.process_gone(pid) for pid in pids[True]), "the worker's exit ended it"


def test_each_shard_gets_the_variables_a_process_of_its_own_would_have(tmp_path: Path) -> None:
    dump = tmp_path / "env.jsonl"
    script = (
        "import json, os, sys\n"
        "def run(env):\n"
        "    seen = {k: v for k, v in env.items() if k.startswith('SHARDOPS_')}\n"
        "    seen.pop('SHARDOPS_PERSISTENT', None)\n"
        f"    open({str(dump)!r}, 'a').write(json.dumps(seen) + '\\n')\n"
        "    with open(env['SHARDOPS_RESULTS_FILE'], 'a') as out:\n"
        "        for line in open(env['SHARDOPS_ITEMS_FILE']):\n"
        "            out.write(json.dumps({'key': json.loads(line)['key'], 'result': 1}) + '\\n')\n"
        "if os.environ.get('SHARDOPS_PERSISTENT') == '1':\n"
        "    for line in iter(sys.stdin.readline, ''):\n"
        "        run({**os.environ, **json.loads(line)['env']})\n"
        "        print(json.dumps({'shard': json.loads(line)['shard'], 'exit': 0}), flush=True)\n"
        "else:\n"
        "    run(os.environ)\n"
    )
    seen = {}
    for persistent in (False, True):
        kube = FakeKube()
        body = _campaign([{"id": i} for i in range(4)], persistent, command=[sys.executable, "-c", script])
        add_campaign(kube, body)
        assert workerkit.worker(kube, tmp_path / "work", claim_candidates=1).run() == 0
        dumps = [json.loads(line) for line in dump.read_text().splitlines()]
        dump.unlink()
        # The attempt directories are fresh each time: compare the file names within them.
        seen[persistent] = [
            {k: v.replace(os.path.dirname(d["SHARDOPS_ITEMS_FILE"]), "<attempt>") for k, v in d.items()}
            for d in dumps
        ]
    assert seen[True] == seen[False]
    assert [d["SHARDOPS_SHARD"] for d in seen[True]] == ["camp-00000", "camp-00001"]
    assert seen[True][0]["SHARDOPS_RESULTS_FILE"] == "<attempt>/results.jsonl"


def test_the_command_starts_at_the_first_look_and_the_first_shard_is_served_by_it(tmp_path: Path) -> None:
    """Started ahead: at a slot's first look, before it has a shard (here the only one is another
    worker's), so the process's start overlaps the wait for a claim. The shard claimed later is
    served by that process as one started for it: the same environment (not replaced), counted once."""
    kube = FakeKube()
    ledger = tmp_path / "ledger.jsonl"
    body = _campaign([{"id": 0}], True, shardSize=1, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
    (shard,) = add_campaign(kube, body)
    workerkit.held_by_another(kube, shard, dt.datetime.now(dt.UTC))
    worker = workerkit.worker(kube, tmp_path / "work")
    try:
        assert worker._step() is None, "the only shard is another worker's"
        ahead = worker.commands.process
        assert ahead is not None and not ahead.served and ahead.popen.poll() is None
        assert _starts(worker, "persistent") == 0, "counted when it serves its first shard"
        # The other worker lets go; the shard changes (a new version), so it is tried again.
        kube.delete(LEASES, NAMESPACE, shard.lease_name)
        current = kube.obj(SHARDS, NAMESPACE, shard.name)
        assert current is not None
        current["metadata"].setdefault("annotations", {})["touched"] = "1"
        kube.put(SHARDS, NAMESPACE, current)
        assert worker._step() is Outcome.DONE
    finally:
        worker.close()
    assert {e["pid"] for e in _ledger(ledger) if e["event"] == "done"} == {ahead.pid}
    assert _starts(worker, "persistent") == 1


def test_a_crash_fails_only_its_shard_as_a_process_per_shard_would_and_the_next_gets_a_new_process(
    tmp_path: Path,
) -> None:
    items = [{"id": 0}, {"id": 1}, {"id": 2}, {"id": 3, "fault": "crash"}, {"id": 4}, {"id": 5}]
    outcomes = {}
    for persistent in (False, True):
        kube = FakeKube()
        ledger = tmp_path / f"ledger-{persistent}.jsonl"
        body = _campaign(items, persistent, maxAttempts=1, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
        shards = add_campaign(kube, body)
        worker = workerkit.worker(kube, tmp_path / "work", claim_candidates=1)
        assert worker.run() == 0
        outcomes[persistent] = [_outcome(kube, s) for s in shards]
    assert outcomes[True] == outcomes[False]
    assert [o[0] for o in outcomes[True]] == ["Done", "Blocked", "Done"]
    assert outcomes[True][1][1:] == ("unknown", "killed by SIGKILL (exit code 137)")
    pids: dict[str, set[int]] = {s.name: set() for s in shards}
    for entry in _ledger(ledger):
        pids[entry["shard"]].add(entry["pid"])
    first, crashed, after = (pids[s.name] for s in shards)
    assert len(first) == 1 and first == crashed, "the process that served shard 0 crashed in shard 1"
    assert len(after) == 1 and after != crashed
    assert _starts(worker, "persistent") == 2


def test_a_lost_lease_kills_the_process_and_the_next_shard_starts_a_new_one(tmp_path: Path) -> None:
    kube = FakeKube()
    ledger = tmp_path / "ledger.jsonl"
    items = [{"id": 0, "latency": 30}, {"id": 1}]
    body = _campaign(items, True, shardSize=1, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
    first, second = add_campaign(kube, body)
    stolen: list[str] = []

    def thief(fake: FakeKube, verb: str, resource: Resource, name: str) -> None:
        # At the first renewal (the first shard's heartbeat): another worker holds its Lease now.
        if resource is LEASES and verb == "patch" and not stolen:
            lease = fake.obj(LEASES, NAMESPACE, name)
            assert lease is not None
            fake.put(LEASES, NAMESPACE, {**lease, "spec": {**lease["spec"], "holderIdentity": "thief"}})
            stolen.append(name)

    kube.before.append(thief)
    worker = workerkit.worker(kube, tmp_path / "work", claim_candidates=1)
    started = time.monotonic()
    assert worker.run() == 0
    assert stolen == [first.name] and time.monotonic() - started < 15
    assert _shard(kube, second.name).phase == "Done"
    entries = _ledger(ledger)
    fenced_pid = next(e["pid"] for e in entries if e["shard"] == first.name)
    assert [e["event"] for e in entries if e["shard"] == first.name] == ["start"], "stopped mid-item"
    assert next(e["pid"] for e in entries if e["shard"] == second.name) != fenced_pid
    assert workerkit.process_gone(fenced_pid)
    assert _starts(worker, "persistent") == 2
    assert worker.metrics.sample("shardops_worker_fenced_total", reason="lease") == 1


def test_sigterm_stops_the_process_and_releases_the_shard(tmp_path: Path) -> None:
    kube = FakeKube()
    ledger = tmp_path / "ledger.jsonl"
    items = [{"id": 0}, {"id": 1, "latency": 30}]
    (shard,) = add_campaign(
        kube, _campaign(items, True, shardSize=2, env={"SHARDOPS_AGENT_LEDGER": str(ledger)})
    )
    work_dir = tmp_path / "work"
    worker = workerkit.worker(kube, work_dir, term_grace_seconds=5)

    workerkit.stop_after_first_result(worker, work_dir)
    started = time.monotonic()
    assert worker.run() == 0
    assert time.monotonic() - started < 10, "the process was not stopped promptly"
    released = _shard(kube, shard.name).current_status
    assert released.phase == "Pending" and released.attempt == 1
    assert released.progress is not None and released.progress.done == 1
    assert workerkit.process_gone(_ledger(ledger)[0]["pid"])
    assert list(work_dir.iterdir()) == []


def test_a_malformed_answer_fails_the_shard_as_bad_output(tmp_path: Path) -> None:
    kube = FakeKube()
    # Writes every result, then a log line where its answer belongs.
    script = (
        "import json, sys\n"
        "env = json.loads(sys.stdin.readline())['env']\n"
        "with open(env['SHARDOPS_RESULTS_FILE'], 'a') as out:\n"
        "    for line in open(env['SHARDOPS_ITEMS_FILE']):\n"
        "        out.write(json.dumps({'key': json.loads(line)['key'], 'result': 1}) + '\\n')\n"
        "print('all done!', flush=True)\n"
        "sys.stdin.readline()\n"
    )
    body = _campaign([{"id": 1}], True, shardSize=1, command=[sys.executable, "-c", script])
    (shard,) = add_campaign(kube, body)
    assert workerkit.worker(kube, tmp_path / "work").run() == 0
    phase, error_class, message = _outcome(kube, shard)
    assert (phase, error_class) == ("Failed", "bad-output")
    assert message is not None and "answer for shard camp-00000 must be one line" in message
    assert "'all done!'" in message and "write logs to stderr" in message
