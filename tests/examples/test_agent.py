"""The example agent speaks the worker protocol and injects the faults the tests rely on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shardops.logic.failures import classify_failure
from shardops.worker.runner import read_error_file

AGENT = [sys.executable, "-m", "shardops_example_agent.agent"]


def _run(
    tmp_path: Path, items: list[Any], attempt: int = 1, source: str = "", **env: str
) -> tuple[int, list[dict[str, Any]], Path]:
    items_file = tmp_path / "items.jsonl"
    items_file.write_text(
        "".join(json.dumps({"key": f"k{i}", "index": i, "item": item}) + "\n" for i, item in enumerate(items))
    )
    results = tmp_path / "results.jsonl"
    results.write_text("")
    error = tmp_path / "error.json"
    error.unlink(missing_ok=True)
    environment = {
        **os.environ,
        "SHARDOPS_ITEMS_FILE": str(items_file),
        "SHARDOPS_RESULTS_FILE": str(results),
        "SHARDOPS_ERROR_FILE": str(error),
        "SHARDOPS_SOURCE": source,
        "SHARDOPS_SHARD": "s",
        "SHARDOPS_ATTEMPT": str(attempt),
        "SHARDOPS_AGENT_LATENCY": "0",
        **env,
    }
    code = subprocess.run(AGENT, env=environment, check=False, timeout=30).returncode
    lines = [json.loads(line) for line in results.read_text().splitlines() if line.startswith("{")]
    return code, lines, error


def test_one_keyed_result_line_per_item_with_cost_and_a_deterministic_answer(tmp_path: Path) -> None:
    code, lines, _ = _run(tmp_path, [{"q": 1}, {"q": 2, "cost": 0.5}], source="A", SHARDOPS_AGENT_COST="0.25")
    assert code == 0
    assert [(r["key"], r["cost"], r["result"]["source"], r["result"]["attempt"]) for r in lines] == [
        ("k0", 0.25, "A", 1),
        ("k1", 0.5, "A", 1),
    ]
    again = _run(tmp_path, [{"q": 1}], attempt=2)[1]
    assert again[0]["result"]["answer"] == lines[0]["result"]["answer"]


def test_rate_limited_source_is_a_retryable_error_file(tmp_path: Path) -> None:
    code, lines, error = _run(tmp_path, [{"q": 1}], source="A", SHARDOPS_AGENT_RATE_LIMITED_SOURCES="A,B")
    assert code == 75 and lines == []
    classified = classify_failure(code, read_error_file(error), None)
    assert classified is not None and classified.error_class == "rate-limited" and classified.source == "A"
    assert _run(tmp_path, [{"q": 1}], source="C", SHARDOPS_AGENT_RATE_LIMITED_SOURCES="A,B")[0] == 0


def test_item_faults(tmp_path: Path) -> None:
    code, _, error = _run(tmp_path, [{"fault": "invalid"}])
    classified = classify_failure(code, read_error_file(error), None)
    assert code == 65 and classified is not None and classified.error_class == "invalid-input"
    code, _, error = _run(tmp_path, [{"fault": "timeout"}])
    assert code == 75 and (read_error_file(error) or {})["class"] == "timeout"
    assert _run(tmp_path, [{"fault": "crash"}])[0] == -signal.SIGKILL
    results = tmp_path / "results.jsonl"
    assert _run(tmp_path, [{"fault": "garbage"}])[0] == 0 and "this is not JSON {" in results.read_text()
    _, lines, _ = _run(tmp_path, [{"fault": "big", "bytes": 5000}])
    assert len(lines[0]["result"]["padding"]) == 5000
    # An item fault can be limited to some attempts.
    assert _run(tmp_path, [{"fault": "crash", "faultAttempts": [1]}], attempt=2)[0] == 0


def test_crash_after_n_items_only_on_the_chosen_attempts_and_the_ledger(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    env = {
        "SHARDOPS_AGENT_CRASH_AFTER": "2",
        "SHARDOPS_AGENT_FAULT_ATTEMPTS": "1",
        "SHARDOPS_AGENT_LEDGER": str(ledger),
    }
    code, lines, _ = _run(tmp_path, [{"q": i} for i in range(4)], **env)
    assert code == -signal.SIGKILL and [r["key"] for r in lines] == ["k0", "k1"]
    code, lines, _ = _run(tmp_path, [{"q": i} for i in range(4)], attempt=2, **env)
    assert code == 0 and len(lines) == 4
    entries = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert [(e["event"], e["attempt"]) for e in entries].count(("done", 1)) == 2
    assert [(e["event"], e["attempt"]) for e in entries].count(("done", 2)) == 4


def test_hang_stops_progress_and_sigterm_ends_it_between_writes(tmp_path: Path) -> None:
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"key": f"k{i}", "index": i, "item": {}}) + "\n" for i in range(3)))
    results = tmp_path / "results.jsonl"
    environment = {
        **os.environ,
        "SHARDOPS_ITEMS_FILE": str(items),
        "SHARDOPS_RESULTS_FILE": str(results),
        "SHARDOPS_ERROR_FILE": str(tmp_path / "e"),
        "SHARDOPS_AGENT_LATENCY": "0",
        "SHARDOPS_AGENT_HANG_AFTER": "1",
    }
    process = subprocess.Popen(AGENT, env=environment)
    deadline = time.monotonic() + 10
    while not results.exists() or not results.read_text():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    # Hanging: still alive, no second result.
    assert process.poll() is None and len(results.read_text().splitlines()) == 1
    process.send_signal(signal.SIGTERM)
    assert process.wait(10) == 143
    assert len(results.read_text().splitlines()) == 1


def _request(tmp_path: Path, shard: str, items: list[Any], **env: str) -> str:
    """A persistent run's request line for `shard`, its files under tmp_path/shard."""
    directory = tmp_path / shard
    directory.mkdir()
    items_file = directory / "items.jsonl"
    items_file.write_text(
        "".join(json.dumps({"key": f"k{i}", "index": i, "item": item}) + "\n" for i, item in enumerate(items))
    )
    (directory / "results.jsonl").write_text("")
    shard_env = {
        "SHARDOPS_ITEMS_FILE": str(items_file),
        "SHARDOPS_RESULTS_FILE": str(directory / "results.jsonl"),
        "SHARDOPS_ERROR_FILE": str(directory / "error.json"),
        "SHARDOPS_SHARD": shard,
        "SHARDOPS_ATTEMPT": "1",
        **env,
    }
    return json.dumps({"shard": shard, "env": shard_env}) + "\n"


def _results(tmp_path: Path, shard: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp_path / shard / "results.jsonl").read_text().splitlines()]


def _serve(tmp_path: Path, requests: list[str], **env: str) -> tuple[int, list[Any], int]:
    """The agent as a persistent command given `requests`, then the end of input: its exit code, its
    answers and its pid."""
    environment = {**os.environ, "SHARDOPS_PERSISTENT": "1", "SHARDOPS_AGENT_LATENCY": "0", **env}
    process = subprocess.Popen(AGENT, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = process.communicate("".join(requests).encode(), timeout=30)
    return process.returncode, [json.loads(line) for line in out.splitlines()], process.pid


def test_persistent_runs_each_request_as_its_own_run_and_answers_its_exit_code(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    requests = [
        _request(tmp_path, "a", [{"q": 1}, {"q": 2}], SHARDOPS_SOURCE="A"),
        _request(tmp_path, "b", [{"q": 3}], SHARDOPS_SOURCE="B"),
        _request(tmp_path, "c", [{"q": 1}], SHARDOPS_SOURCE="A", SHARDOPS_ATTEMPT="2"),
    ]
    code, answers, pid = _serve(
        tmp_path, requests, SHARDOPS_AGENT_RATE_LIMITED_SOURCES="B", SHARDOPS_AGENT_LEDGER=str(ledger)
    )
    assert code == 0, "the end of input ends it"
    assert [a["exit"] for a in answers] == [0, 75, 0]
    assert all(set(a) == {"shard", "exit"} for a in answers), "each answer names its shard"
    first, third = _results(tmp_path, "a"), _results(tmp_path, "c")
    assert [(r["key"], r["result"]["source"], r["result"]["attempt"]) for r in first] == [
        ("k0", "A", 1),
        ("k1", "A", 1),
    ]
    assert third[0]["result"] == {**first[0]["result"], "attempt": 2}, "the same answer, its own attempt"
    classified = classify_failure(75, read_error_file(tmp_path / "b" / "error.json"), None)
    assert classified is not None and classified.error_class == "rate-limited" and classified.source == "B"
    assert _results(tmp_path, "b") == [] and not (tmp_path / "a" / "error.json").exists()
    assert {json.loads(line)["pid"] for line in ledger.read_text().splitlines()} == {pid}


def test_persistent_a_crash_knob_in_a_request_kills_the_process_in_that_shard(tmp_path: Path) -> None:
    requests = [
        _request(tmp_path, "a", [{"q": 1}]),
        _request(tmp_path, "b", [{"q": 2}, {"q": 3}], SHARDOPS_AGENT_CRASH_AFTER="1"),
        _request(tmp_path, "c", [{"q": 4}]),
    ]
    code, answers, _ = _serve(tmp_path, requests)
    assert code == -signal.SIGKILL and [a["exit"] for a in answers] == [0], "killed in b, before answering it"
    assert len(_results(tmp_path, "b")) == 1 and _results(tmp_path, "c") == []


def test_persistent_sigterm_ends_the_process_not_just_the_shard(tmp_path: Path) -> None:
    environment = {**os.environ, "SHARDOPS_PERSISTENT": "1", "SHARDOPS_AGENT_LATENCY": "0"}
    process = subprocess.Popen(AGENT, env=environment, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert process.stdin is not None
    process.stdin.write(_request(tmp_path, "a", [{"q": 1}, {"fault": "hang"}]).encode())
    process.stdin.flush()
    deadline = time.monotonic() + 10
    while not _results(tmp_path, "a"):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.02)
    process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=10)
    assert process.returncode == 143 and out == b"", "no answer: the process ended"
