"""A long run on the local engine: 1,000 rounds of a tiny job across chained executions, with
round time and memory measured round by round (they must stay flat).

    nice -n 10 .venv/bin/python bench/long_run.py [--rounds 1000] [--per-execution 100] [--smoke]

`--smoke`: 6 rounds, 2 per execution (chained), windows of 2 rounds; printed, not written.

Records bench/results/long_run.json: rounds completed, executions used, the largest history of
any one execution, wall time and seconds per round, and per window of 100 rounds the mean round
interval (between consecutive ROUND items' `finished_at`: plan, train, aggregate and the local
state's save), the part of it between rounds, CPU seconds per round (this process and the
handlers: apart from the load, which stretches wall time), the machine's own state (a control
probe's time, PROBE; the share of CPU time the VM's host stole; iowait) and the resident memory of this process (moto, the runner) and of the handler
processes at the window's end. `flat`: the last window's median round time over the first's, divided by
the probe's drift, within 15 % either way (`time_flat`), and both RSS drifts at most 1.15 (`memory_flat`).
Also: this process's largest RSS over the whole run (its outputs fetched at the end included) and
the bytes the engine moved to disk instead (finished executions' histories and S3 bodies;
apart, the DynamoDB items' bytes; smlt/local/memory.py). `--profile R` adds what this process allocated from round R on and still
holds at the end, per round, by source file (tracemalloc), and what moto stores per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402 - needs ROOT on the path when run as a script

WINDOW = 100
FLAT = 0.15  # the last window within 15 % of the first


def flatness(drift: dict[str, float | None], machine: float | None) -> dict[str, object]:
    """The run's verdict. Time: the median round's drift over the probe's (the machine's own
    slowdown), two-sided: a run that got faster because the host stopped stealing CPU is not
    evidence of flatness, nor one slowed by it of growth. Memory: the RSS drifts, one-sided."""
    t = drift.get("median_round_s")
    over_probe = t / machine if t and machine else None
    time_flat = over_probe is not None and 1 / (1 + FLAT) <= over_probe <= 1 + FLAT
    rss = [drift.get(f) for f in ("runner_rss_mb", "handlers_rss_mb")]
    memory_flat = all(v is not None and v <= 1 + FLAT for v in rss)
    return {
        "median_round_over_probe": round(over_probe, 3) if over_probe is not None else None,
        "time_flat": time_flat,
        "memory_flat": memory_flat,
        "flat": time_flat and memory_flat,
    }


# /proc is read with plain strings, not pathlib: pathlib interns every part of a path, and the
# thread ids under /proc/PID/task are new every round (moto answers on a thread per connection),
# so the sampler itself grew this process by ~20 KB a sample (tracemalloc, --profile).


def rss_mb(pid: int) -> float:
    """Resident memory of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_s(pid: int) -> float:
    """CPU seconds of one process and of its children it has reaped (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def machine_ticks() -> tuple[int, int, int]:
    """/proc/stat's all-CPU line: (steal, iowait, all) ticks since boot. Steal: the time this VM's
    cores waited for the host, which slows everything run here alike."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return ticks[7], ticks[4], sum(ticks[:8])


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (the fork server and the handler processes)."""
    out, todo = [], [pid]
    while todo:
        kids = []
        task_dir = f"/proc/{todo.pop()}/task"
        try:
            tasks = os.listdir(task_dir)
        except OSError:
            tasks = []
        for t in tasks:  # per thread: one ending while it is read must not hide the others' children
            try:
                with open(f"{task_dir}/{t}/children") as f:
                    kids += [int(c) for c in f.read().split()]
            except OSError:
                pass
        out += kids
        todo += kids
    return out


# The control: a fixed piece of interpreter work (dicts, strings, JSON: what moto, botocore and the
# handlers spend their time on), timed every half second in a process of its own. This machine's 2
# cores are a shared VM's and change speed over minutes: in a quiet 1,000-round run the workers'
# own compute of the same one step (`compute_s`, nothing of the run's state in it) went 0.7 ->
# 1.1 ms, like every other part of the round. The probe says how much of a window's time is that.
PROBE = """
import json, sys, time
def work():
    d = {str(i): [i, str(i)] for i in range(6000)}
    return len(json.loads(json.dumps(d)))
while True:
    t = time.perf_counter(); work(); dt = time.perf_counter() - t
    print(time.time(), dt, flush=True)
    time.sleep(0.5)
"""


class SpeedProbe:
    """Runs PROBE beside the run; `at(t0, t1)`: its median time over that span, in ms."""

    def __enter__(self) -> SpeedProbe:
        import subprocess
        import sys

        self._out = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen([sys.executable, "-c", PROBE], stdout=self._out)
        return self

    def __exit__(self, *_: Any) -> None:
        self._proc.kill()
        self._proc.wait()
        self._out.seek(0)
        self.samples = [tuple(map(float, line.split())) for line in self._out if line.count(" ") == 1]
        self._out.close()

    def at(self, t0: float, t1: float) -> float:
        times = [dt for t, dt in self.samples if t0 <= t <= t1]
        return round(statistics.median(times) * 1000, 2) if times else 0.0


class MemorySampler:
    """Samples (time, own RSS, handler processes' RSS, CPU seconds of all of them) every
    `interval` seconds."""

    def __init__(self, interval: float = 1.0) -> None:
        self.samples: list[tuple[float, float, float, float, float]] = []
        self.load: list[float] = []  # the machine's 1-minute load average at each sample (2 shared cores)
        self.ticks: list[tuple[int, int, int]] = []  # machine_ticks() at each sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)

    def _run(self, interval: float) -> None:
        me = os.getpid()
        while not self._stop.wait(interval):
            kids = descendants(me)
            cpu = (cpu_s(me), sum(cpu_s(p) for p in kids))
            self.samples.append((time.time(), rss_mb(me), sum(rss_mb(p) for p in kids), *cpu))
            self.load.append(os.getloadavg()[0])
            self.ticks.append(machine_ticks())

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t: float) -> tuple[float, float]:
        """The last sample taken at or before `t` (own, handlers)."""
        before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
        return (before[-1][1], before[-1][2]) if before else (0.0, 0.0)

    def cpu_at(self, t: float) -> tuple[float, float]:
        """CPU seconds used by this process and by the handlers, at the last sample at or before `t`."""
        before = [s for s in self.samples if s[0] <= t] or self.samples[:1]
        return (before[-1][3], before[-1][4]) if before else (0.0, 0.0)

    def steal_iowait(self, t0: float, t1: float) -> tuple[float, float]:
        """The share of all CPU time between t0 and t1 that was stolen by the host, and iowait."""
        span = [x for s, x in zip(self.samples, self.ticks, strict=False) if t0 <= s[0] <= t1]
        if len(span) < 2 or span[-1][2] == span[0][2]:
            return 0.0, 0.0
        total = span[-1][2] - span[0][2]
        return round((span[-1][0] - span[0][0]) / total, 4), round((span[-1][1] - span[0][1]) / total, 4)

    def mean_load(self, t0: float, t1: float) -> float:
        """The mean load average over the samples taken between t0 and t1."""
        loads = [x for s, x in zip(self.samples, self.load, strict=False) if t0 <= s[0] <= t1]
        return round(statistics.fmean(loads), 2) if loads else 0.0


def windows(
    finished: list[float], round_s: list[float], memory: MemorySampler, probe: SpeedProbe, size: int = WINDOW
) -> list[dict[str, Any]]:
    """Per window of WINDOW rounds: the mean and median round interval, the median time between
    rounds (the interval less the round's own plan-to-aggregated `round_s`: the planner's decision,
    the state machine's transitions), CPU per round, memory at its end."""
    out = []
    for start in range(1, len(finished), size):
        chunk = finished[start - 1 : start + size]
        gaps = [b - a for a, b in zip(chunk, chunk[1:], strict=False)]
        between = [g - r for g, r in zip(gaps, round_s[start : start + size], strict=False)]
        if not gaps:
            continue
        own, handlers = memory.at(chunk[-1])
        cpu_start, cpu_end = (tuple(x / len(gaps) for x in memory.cpu_at(t)) for t in (chunk[0], chunk[-1]))
        out.append(
            {
                "rounds": f"{start}-{start + len(gaps) - 1}",
                "mean_round_s": round(statistics.fmean(gaps), 4),
                "median_round_s": round(statistics.median(gaps), 4),
                "median_between_rounds_s": round(statistics.median(between), 4),
                "runner_rss_mb": round(own, 1),
                "handlers_rss_mb": round(handlers, 1),
                # CPU per round: what the work costs, apart from how long other load made it wait.
                "cpu_s_per_round": round(sum(cpu_end) - sum(cpu_start), 4),
                "runner_cpu_s_per_round": round(cpu_end[0] - cpu_start[0], 4),
                "load_average": memory.mean_load(chunk[0], chunk[-1]),
                "probe_ms": probe.at(chunk[0], chunk[-1]),
                "steal_share": memory.steal_iowait(chunk[0], chunk[-1])[0],
                "iowait_share": memory.steal_iowait(chunk[0], chunk[-1])[1],
            }
        )
    return out


def ratio(w: list[dict[str, Any]], field: str) -> float | None:
    return round(w[-1][field] / w[0][field], 3) if len(w) > 1 and w[0][field] else None


def moto_counts() -> dict[str, int]:
    """What moto holds for the run (this process's moto): DynamoDB items, S3 object versions."""
    from moto.dynamodb.models import dynamodb_backends
    from moto.s3.models import s3_backends

    items = sum(len(t) for r in dynamodb_backends.values() for b in r.values() for t in b.tables.values())
    objects = sum(
        len(versions)
        for r in s3_backends.values()
        for b in r.values()
        for bucket in b.buckets.values()
        for _, versions in bucket.keys.iterlists()
    )
    return {"dynamodb_items": items, "s3_objects": objects}


class Profile:
    """--profile R: from round R on, what this process allocates and still holds at the end
    (tracemalloc, by source file), per round, and what moto stores per round. Slows the run."""

    def __init__(self, start: int) -> None:
        self.start, self.rounds, self.rounds0 = start, 0, 0
        self.counts0: dict[str, int] = {}
        self.taken: dict[str, Any] = {}

    def install(self) -> None:
        import tracemalloc

        from smlt import runner, snapshot

        take_new = snapshot.Snapshot.take_new

        def counted(snap: Any) -> Any:
            new = take_new(snap)
            self.rounds += len(new)
            if self.rounds >= self.start and not tracemalloc.is_tracing():
                self.counts0, self.rounds0 = moto_counts(), self.rounds
                tracemalloc.start()
            return new

        snapshot.Snapshot.take_new = counted  # type: ignore[method-assign]
        history = runner.Follower.history

        def measured_first(follower: Any) -> Any:
            self.taken = self.take()  # the last round is done; the outputs (history.json...) are not counted
            return history(follower)

        runner.Follower.history = measured_first  # type: ignore[method-assign]

    def result(self) -> dict[str, Any]:
        return self.taken or self.take()

    def take(self) -> dict[str, Any]:
        import tracemalloc

        if not tracemalloc.is_tracing():
            return {}
        stats = tracemalloc.take_snapshot().statistics("filename")
        tracemalloc.stop()
        n = max(1, self.rounds - self.rounds0)
        site = str(Path(statistics.__file__).parent)
        counts = moto_counts()
        return {
            "rounds": f"{self.rounds0}-{self.rounds}",
            "held_kb_per_round": round(sum(s.size for s in stats) / n / 1024, 1),
            "by_file_kb_per_round": {
                s.traceback[0]
                .filename.replace(str(ROOT) + "/", "")
                .replace(site + "/", "")
                .split("site-packages/")[-1]: round(s.size / n / 1024, 2)
                for s in stats[:15]
            },
            "moto_per_round": {k: round((counts[k] - self.counts0[k]) / n, 2) for k in counts},
        }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--per-execution", type=int, default=100)
    ap.add_argument("--result", default=str(ROOT / "bench/results/long_run.json"))
    ap.add_argument("--profile", type=int, metavar="R", help="trace what is held from round R on (slow)")
    smoke.add_flag(ap)
    args = ap.parse_args()
    window = WINDOW
    if args.smoke:
        args.rounds, args.per_execution, window = 6, 2, 2
    profile = Profile(args.profile) if args.profile is not None else None
    if profile is not None:
        profile.install()

    from smlt.datasets import stage_dataset
    from smlt.local.memory import BODIES, HISTORIES, ITEMS
    from smlt.reconcile import reconcile_saved
    from smlt.runner import execute, start_engine
    from smlt.runtime.errors import RunFailed

    job = {
        "name": "long",
        "dataset": {"uri": "sklearn:digits"},
        "model": {"name": "logreg"},
        "training": {"max_rounds": args.rounds, "local_steps": 1, "batch_size": 16, "learning_rate": 0.01},
        "workers": {"initial": 2, "memory_mb": 1769},
        "rounds_per_execution": args.per_execution,
    }
    engine, names, _ = start_engine(None)
    try:
        job["dataset"]["uri"] = stage_dataset(job["dataset"]["uri"], names.data_bucket, client=engine.client("s3"))
        out = Path(tempfile.mkdtemp(prefix="smlt-long-"))
        t0 = time.time()
        with MemorySampler() as memory, SpeedProbe() as probe:
            try:
                execute(engine, names, "long-run", job, out)
                rc = 0
            except RunFailed:
                rc = 1
        wall = time.time() - t0
        spilled = HISTORIES.size + BODIES.size  # on disk, not in memory: what the engine moved out of moto
        spilled_items = ITEMS.size  # the DynamoDB items' bytes (re-frozen items are written again)
        profiled = profile.result() if profile is not None else None
    finally:
        engine.stop()
    metrics = json.loads((out / "metrics.json").read_text())
    history = json.loads((out / "history.json").read_text())
    per_exec: dict[str, int] = {}
    for e in history:
        per_exec[e["execution"]] = per_exec.get(e["execution"], 0) + 1
    ordered = sorted(metrics["rounds"], key=lambda r: r["round"])
    w = windows([r["finished_at"] for r in ordered], [r["round_s"] for r in ordered], memory, probe, window)
    drift = {f: ratio(w, f) for f in ("mean_round_s", "median_round_s", "runner_rss_mb", "handlers_rss_mb")}
    cpu_drift = ratio(w, "cpu_s_per_round")  # reported beside `flat`, not part of it (the issue asks for time)
    machine = ratio(w, "probe_ms")  # the machine's own slowdown, last window over first
    result = {
        "rounds_requested": args.rounds,
        "rounds_per_execution": args.per_execution,
        "exit_code": rc,
        "rounds_trained": metrics["final"]["rounds"],
        "round_records": len(metrics["rounds"]),
        "executions": len(per_exec),
        "max_history_events_per_execution": max(per_exec.values()),
        "history_events_per_round": round(max(per_exec.values()) / args.per_execution, 1),
        "wall_seconds": round(wall, 1),
        "seconds_per_round": round(wall / max(1, len(metrics["rounds"])), 3),
        "val_accuracy": metrics["final"]["val_accuracy"],
        # every update stored, applied once and in the model, from the saved state (smlt.reconcile)
        "reconciliation_findings": [f.model_dump() for f in reconcile_saved(out, "long-run").findings],
        "load_average": round(os.getloadavg()[0], 2),
        "runner_rss_max_mb": round(max((s[1] for s in memory.samples), default=0.0), 1),
        "spilled_mb": round(spilled / 2**20, 1),
        "spilled_items_mb": round(spilled_items / 2**20, 1),
        "windows": w,
        "last_over_first": drift,
        "cpu_last_over_first": cpu_drift,
        "probe_last_over_first": machine,
    }
    result.update(flatness(drift, machine))
    if profiled is not None:
        result["profile"] = profiled
    if args.smoke:
        smoke.report(result)
        return
    Path(args.result).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
