"""benchmarks.cpu: telling processes apart and attributing the machine's CPU to them per decile."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import cpu

TICKS = cpu.CLOCK_TICKS


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["/cache/bin/kube-apiserver", "--etcd-servers=http://127.0.0.1:1"], "kube-apiserver"),
        (["/cache/bin/etcd", "--name=local"], "etcd"),
        (["/cache/bin/weed", "-logtostderr", "mini"], "SeaweedFS (weed)"),
        (["/venv/bin/python", "/venv/bin/shardops", "operator"], "shardops operator"),
        (["/venv/bin/python", "/venv/bin/shardops", "worker", "--slots=10"], "shardops workers"),
        (["python3", "/usr/local/bin/shardops-example-agent"], "agents (the workers' commands)"),
        (["/venv/bin/python", "-m", "testbed.cluster.kubelet", "--node-name=n"], "process-kubelet"),
        ([".venv/bin/python", "-m", "benchmarks.load", "--seconds=20"], "benchmark harness"),
        (["bash", "-c", "echo etcd"], "other processes"),
        ([], "other processes"),
    ],
)
def test_a_process_kind_comes_from_its_command_line(argv: list[str], kind: str) -> None:
    assert cpu.kind_of(argv) == kind


def _stat_line(pid: int, name: str, utime: int, stime: int, started: int) -> str:
    # pid (comm) state, then fields 4..: utime and stime are fields 14 and 15, starttime field 22.
    after = ["S"] + ["0"] * 10 + [str(utime), str(stime)] + ["0"] * 6 + [str(started)] + ["0"] * 20
    return f"{pid} ({name}) " + " ".join(after)


class FakeProc:
    """A /proc of a few processes on disk (the counter reads files, so it reads these)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def process(self, pid: int, argv: list[str], utime: int, stime: int = 0, started: int = 100) -> None:
        directory = self.root / str(pid)
        directory.mkdir(exist_ok=True)
        (directory / "stat").write_text(_stat_line(pid, Path(argv[0]).name[:15], utime, stime, started))
        (directory / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")

    def gone(self, pid: int) -> None:
        for child in (self.root / str(pid)).iterdir():
            child.unlink()
        (self.root / str(pid)).rmdir()

    def machine(self, busy: int, idle: int) -> None:
        # user nice system idle iowait irq softirq steal guest guest_nice
        (self.root / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 0 0 0 0\n")


def test_the_counter_attributes_each_interval_to_the_kinds_and_the_rest_to_no_one(tmp_path: Path) -> None:
    proc = FakeProc(tmp_path)
    proc.process(10, ["/bin/kube-apiserver"], utime=5 * TICKS)
    proc.process(11, ["/venv/bin/python", "/venv/bin/shardops", "worker"], utime=TICKS)
    proc.machine(busy=100 * TICKS, idle=0)
    counter = cpu.CpuCounter(proc=tmp_path)
    assert counter.read() == {}  # the baseline

    proc.process(10, ["/bin/kube-apiserver"], utime=7 * TICKS, stime=TICKS)  # +3 s
    proc.process(11, ["/venv/bin/python", "/venv/bin/shardops", "worker"], utime=2 * TICKS)  # +1 s
    proc.process(12, ["/venv/bin/python", "/venv/bin/shardops", "worker"], utime=TICKS)  # new: +1 s whole
    proc.machine(busy=106 * TICKS, idle=10 * TICKS)
    spent = counter.read()
    assert spent["kube-apiserver"] == pytest.approx(3.0)
    assert spent["shardops workers"] == pytest.approx(2.0)
    assert spent[cpu.MACHINE] == pytest.approx(6.0)
    assert spent[cpu.UNATTRIBUTED] == pytest.approx(1.0)

    # A pid used again by another process (another start time) counts from zero, as a new one.
    proc.gone(11)
    proc.process(11, ["/bin/etcd"], utime=TICKS, started=900)
    proc.machine(busy=108 * TICKS, idle=20 * TICKS)
    spent = counter.read()
    assert spent["etcd"] == pytest.approx(1.0)
    assert spent["shardops workers"] == pytest.approx(0.0)
    assert spent[cpu.UNATTRIBUTED] == pytest.approx(1.0)


def test_cores_by_span_spreads_each_sample_over_its_interval_and_divides_by_the_time_covered() -> None:
    samples = [
        (0.0, {}),
        (2.0, {"etcd": 1.0, cpu.MACHINE: 2.0}),
        (4.0, {"etcd": 3.0, cpu.MACHINE: 4.0}),
        (10.0, {"etcd": 3.0, cpu.MACHINE: 6.0}),
    ]
    cores = cpu.cores_by_span(samples, [(0.0, 4.0), (4.0, 10.0), (10.0, 20.0), (1.0, 3.0), (9.0, 12.0)])
    assert list(cores) == [cpu.MACHINE, "etcd"]  # the table's order
    # (1, 3): half of the first interval and half of the second; (9, 12): one sixth of the third,
    # the rest of it after the last sample (not covered).
    assert cores["etcd"] == [1.0, 0.5, None, 1.0, 0.5]
    assert cores[cpu.MACHINE] == [1.5, 1.0, None, 1.5, 1.0]
