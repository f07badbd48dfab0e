"""Fault injection for the local engine:
`--faults "fail=0.2,duplicate=0.05,throttle=0.05,timeout=0.02,s3_conflict=0.1,ddb_conflict=0.1,seed=7"`.

Each worker invocation draws once: with the given probabilities it fails (an error raised in
the worker), is duplicated (the handler runs twice), is throttled (Lambda's 429
TooManyRequestsException) or times out; otherwise it runs normally. Independently, inside every
handler process (workers, planner, aggregator), each conditional S3 write answers 409
ConditionalRequestConflict with probability `s3_conflict` and each DynamoDB write a transaction
conflict with probability `ddb_conflict` (see smlt/local/conflicts.py).

Seeded, so a run with the same faults and seed sees the same fault pattern (as far as the
order of concurrent invocations allows). `seed=N` picks the pattern; without it the seed derives
from the job's own `seed`, so runs of different job seeds see different faults.
"""

from __future__ import annotations

import hashlib
import random
import tempfile
import threading
from dataclasses import dataclass, field

from smlt.local.conflicts import KINDS as CONFLICTS
from smlt.local.conflicts import Plan, tallied

ACTIONS = ("fail", "duplicate", "throttle", "timeout")  # per invocation, one of them at most
NAMES = (*ACTIONS, *CONFLICTS, "seed")


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
        else:
            rates[name] = _rate(name, value)
    if sum(rates.get(a, 0.0) for a in ACTIONS) > 1:
        raise ValueError(f"--faults: the rates of {', '.join(ACTIONS)} add up to more than 1")
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
        self._counts = {a: 0 for a in ("ok", *ACTIONS)}
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
        if self._tally is None:
            return {}
        with self._lock:
            seed = self._conflict_rng.getrandbits(64)
        rates = {k: self.rates[k] for k in CONFLICTS if self.rates.get(k)}
        return Plan(rates, seed, self._tally.name).env()
