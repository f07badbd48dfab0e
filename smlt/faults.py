"""Fault injection for the local engine:
`--faults "fail=0.2,duplicate=0.05,throttle=0.05,timeout=0.02,s3_conflict=0.1,ddb_conflict=0.1,s3_slowdown=0.05,ddb_throttle=0.05,sfn_throttle=0.05,kill=0.2,crash=0.2,store_outage=5,seed=7"`.

Each worker invocation draws once: with the given probabilities it fails (an error raised in
the worker), is duplicated (the handler runs twice), is throttled (Lambda's 429
TooManyRequestsException) or times out; otherwise it runs normally. Independently, inside every
handler process (workers, planner, aggregator), each conditional S3 write answers 409
ConditionalRequestConflict with probability `s3_conflict` and each DynamoDB write a transaction
conflict with probability `ddb_conflict`, and any S3 request answers 503 SlowDown with probability
`s3_slowdown`, any DynamoDB request a throttle with probability `ddb_throttle`, and any Step
Functions request (Chain's StartExecution) a ThrottlingException with probability `sfn_throttle`
(see smlt/local/conflicts.py).

Control steps: each invocation of Plan, Chain, Aggregate (and its prepare/slice/finish), Finalize and PrepareData
dies with probability `kill`: its handler process is killed (SIGKILL) after the handler has done its
work, before it answers, so the state machine sees `Runtime.ExitError`, as when a Lambda sandbox is
OOM-killed, and its retrier runs the step again. With probability `crash` it dies in the middle
instead: right after its k-th write (S3 PutObject/DeleteObject, DynamoDB PutItem/UpdateItem/
DeleteItem/TransactWriteItems; k drawn from 1 to CRASH_WRITES), so the retry finds some of the
step's writes done and the others not (an invocation with fewer writes runs to its end). `store_outage=S`: the Redis exchange
(SMLT_EXCHANGE_URL, sync mode) goes down once for S seconds, shortly after the first handler
connects: the handlers reach it through a TCP proxy that closes every connection and refuses new
ones for the outage (a failover as the client sees it). Without a Redis exchange it does nothing.

Seeded, so a run with the same faults and seed sees the same fault pattern (as far as the
order of concurrent invocations allows). `seed=N` picks the pattern; without it the seed derives
from the job's own `seed`, so runs of different job seeds see different faults.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse, urlunparse

from smlt.local.conflicts import KINDS as CONFLICTS
from smlt.local.conflicts import Plan, tallied

ACTIONS = ("fail", "duplicate", "throttle", "timeout")  # per invocation, one of them at most
CONTROL = ("kill", "crash")  # per control-step invocation, one of them at most
CRASH_WRITES = 5  # `crash`: the process dies after its k-th write, k in 1..CRASH_WRITES
NAMES = (*ACTIONS, *CONFLICTS, *CONTROL, "store_outage", "seed")
# The ops of the control steps `kill` applies to (the state machine retries them when they die).
CONTROL_OPS = frozenset({"plan", "chain", "finalize", "aggregate", "prepare", "slice", "finish", "prepare_data"})


@dataclass(frozen=True)
class FaultSpec:
    rates: dict[str, float] = field(default_factory=dict)
    seed: int | None = None  # None: derived from the job's seed


def parse_fault_spec(spec: str) -> FaultSpec:
    rates: dict[str, float] = {}
    seed: int | None = None
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in NAMES:
            raise ValueError(f"--faults: {part!r} is not NAME=VALUE with NAME one of {', '.join(NAMES)}")
        if name == "seed":
            seed = _seed(value)
        elif name == "store_outage":
            rates[name] = _seconds(value)
        else:
            rates[name] = _rate(name, value)
    for group in (ACTIONS, CONTROL):
        if sum(rates.get(a, 0.0) for a in group) > 1:
            raise ValueError(f"--faults: the rates of {', '.join(group)} add up to more than 1")
    return FaultSpec(rates, seed)


def parse_faults(spec: str) -> dict[str, float]:
    """The rates of a `--faults` spec (its seed, if any, dropped; see parse_fault_spec)."""
    return parse_fault_spec(spec).rates


def _rate(name: str, value: str) -> float:
    try:
        rate = float(value)
    except ValueError:
        raise ValueError(f"--faults: {name} rate {value!r} is not a number") from None
    if not 0 <= rate <= 1:
        raise ValueError(f"--faults: {name} rate must be between 0 and 1, got {rate}")
    return rate


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"--faults: store_outage {value!r} is not a number of seconds") from None
    if not 0 < seconds <= 600:
        raise ValueError(f"--faults: store_outage must be between 0 and 600 seconds, got {seconds}")
    return seconds


def is_control_step(payload: object) -> bool:
    """An invocation of Plan, Chain, Aggregate (any of its ops) or Finalize, by its event (train events
    name a worker; Aggregate's carries no op)."""
    if not isinstance(payload, dict) or "worker" in payload:
        return False
    op = payload.get("op")
    return op in CONTROL_OPS if op is not None else "outcomes" in payload


def _seed(value: str) -> int:
    try:
        seed = int(value)
    except ValueError:
        raise ValueError(f"--faults: seed {value!r} is not a whole number") from None
    if seed < 0:
        raise ValueError(f"--faults: seed must be 0 or more, got {seed}")
    return seed


def job_fault_seed(job_seed: int) -> int:
    """The fault seed of a job that names none: a function of its seed, unlike it (so the faults
    are not correlated with the training's own draws)."""
    return int.from_bytes(hashlib.sha256(f"smlt-faults:{job_seed}".encode()).digest()[:8], "big")


class FaultInjector:
    """`invoke_filter` for LocalEngine: decides the fate of each invocation of a worker function,
    and (`handler_env`) the conflicts each handler process injects into its own writes."""

    def __init__(self, rates: dict[str, float], functions: set[str] | None = None, seed: int | None = 0):
        self.rates = rates
        self.functions = functions  # None: every function (conflicts apply to every function anyway)
        self._lock = threading.Lock()
        self._counts = {a: 0 for a in ("ok", *ACTIONS, *CONTROL)}
        self._proxy: StoreOutage | None = None
        self._tally: tempfile.TemporaryDirectory[str] | None = None
        if any(rates.get(k) for k in CONFLICTS):
            self._tally = tempfile.TemporaryDirectory(prefix="smlt-faults-")
        self.seed_explicit = seed is not None
        self.reseed(seed if seed is not None else job_fault_seed(0))

    @classmethod
    def from_spec(cls, spec: str, functions: set[str] | None = None) -> FaultInjector:
        parsed = parse_fault_spec(spec)
        return cls(parsed.rates, functions, parsed.seed)

    def reseed(self, seed: int) -> None:
        with self._lock:
            self.seed = seed
            self._rng = random.Random(seed)
            self._conflict_rng = random.Random(f"{seed}:conflicts")  # leaves the invocation draws as they were
            self._kill_rng = random.Random(f"{seed}:kill")
            self._crash_rng = random.Random(f"{seed}:crash")  # where a crash strikes: the kills stay as they were

    def execution_started(self, job: object) -> None:
        """The engine starts an execution of `job`: without an explicit `seed=`, the faults
        follow the job's seed."""
        if not self.seed_explicit:
            seed = job.get("seed", 0) if isinstance(job, dict) else 0
            self.reseed(job_fault_seed(seed if isinstance(seed, int) else 0))

    @property
    def counts(self) -> dict[str, int]:
        """Invocations by fate, and the conflicts handler processes injected so far."""
        with self._lock:
            counts = dict(self._counts)
        if self._tally is not None:
            counts.update(tallied(self._tally.name))
        return counts

    def __call__(self, function_name: str, payload: dict) -> str:
        if is_control_step(payload):
            kill, crash = self.rates.get("kill", 0.0), self.rates.get("crash", 0.0)
            if not kill and not crash:
                return "ok"
            with self._lock:
                draw = self._kill_rng.random()
                if draw < kill:
                    self._counts["kill"] += 1
                    return "kill"
                if draw < kill + crash:
                    self._counts["crash"] += 1
                    return f"crash:{self._crash_rng.randint(1, CRASH_WRITES)}"
            return "ok"
        if self.functions is not None and function_name not in self.functions:
            return "ok"
        with self._lock:
            draw = self._rng.random()
            action, edge = "ok", 0.0
            for name in ACTIONS:
                edge += self.rates.get(name, 0.0)
                if draw < edge:
                    action = name
                    break
            self._counts[action] += 1
        return action

    def handler_env(self) -> dict[str, str]:
        """Environment for one invocation's handler process: its conflict rates and a seed of its
        own ({} when no conflicts are asked for)."""
        env = self._outage_env()
        if self._tally is None:
            return env
        with self._lock:
            seed = self._conflict_rng.getrandbits(64)
        rates = {k: self.rates[k] for k in CONFLICTS if self.rates.get(k)}
        return {**Plan(rates, seed, self._tally.name).env(), **env}

    def _outage_env(self) -> dict[str, str]:
        """SMLT_EXCHANGE_URL through the outage proxy, when a store outage is asked for and the
        exchange is a plain redis:// store."""
        seconds = self.rates.get("store_outage")
        url = self.exchange_url or os.environ.get("SMLT_EXCHANGE_URL", "")
        if not seconds or urlparse(url).scheme != "redis":
            return {}
        with self._lock:
            if self._proxy is None:
                self._proxy = StoreOutage(url, seconds)
            return {"SMLT_EXCHANGE_URL": self._proxy.url}

    exchange_url: str = ""  # the exchange store the outage cuts (default: $SMLT_EXCHANGE_URL)

    @property
    def outage(self) -> StoreOutage | None:
        return self._proxy

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.close()


class StoreOutage:
    """A TCP proxy to a Redis server that goes down once: `delay_s` after its first connection,
    for `seconds`, it closes every open connection and refuses new ones (what clients see of a
    failover); before and after, it passes bytes both ways unchanged."""

    def __init__(self, url: str, seconds: float, delay_s: float = 0.3) -> None:
        parsed = urlparse(url)
        self.target = (parsed.hostname or "127.0.0.1", parsed.port or 6379)
        self.seconds, self.delay_s = seconds, delay_s
        self.down_from: float | None = None  # monotonic time the outage starts
        self.refused = 0  # connections cut or refused during the outage
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", 0))
        port = self._server.getsockname()[1]
        userinfo = parsed.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{port}" if userinfo else f"127.0.0.1:{port}"
        self.url = urlunparse(parsed._replace(netloc=netloc))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True, name="smlt-store-outage").start()

    def down(self) -> bool:
        now = time.monotonic()
        return self.down_from is not None and self.down_from <= now < self.down_from + self.seconds

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            with self._lock:
                if self.down_from is None:
                    self.down_from = time.monotonic() + self.delay_s
                    threading.Timer(self.delay_s, self._cut).start()
            if self.down():
                self.refused += 1
                conn.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._open.update((conn, upstream))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _cut(self, counted: bool = True) -> None:
        """The outage begins: every open connection is closed."""
        with self._lock:
            cut, self._open = self._open, set()
            self.refused += len(cut) // 2 if counted else 0
        for s in cut:
            _close(s)

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data or self.down():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
            _close(src)
            _close(dst)

    def close(self) -> None:
        self._closed = True
        _close(self._server)
        self._cut(counted=False)


def _close(s: Any) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
