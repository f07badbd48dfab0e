"""Fault injection for the local engine: `--faults "fail=0.2,duplicate=0.05,throttle=0.05,timeout=0.02"`.

Each worker invocation draws once: with the given probabilities it fails (an error raised in
the worker), is duplicated (the handler runs twice), is throttled (Lambda's 429
TooManyRequestsException) or times out; otherwise it runs normally. Seeded, so a run with the
same faults sees the same faults.
"""

from __future__ import annotations

import random
import threading

ACTIONS = ("fail", "duplicate", "throttle", "timeout")


def parse_faults(spec: str) -> dict[str, float]:
    rates: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, sep, value = part.partition("=")
        if not sep or name not in ACTIONS:
            raise ValueError(f"--faults: {part!r} is not NAME=RATE with NAME one of {', '.join(ACTIONS)}")
        try:
            rate = float(value)
        except ValueError:
            raise ValueError(f"--faults: {name} rate {value!r} is not a number") from None
        if not 0 <= rate <= 1:
            raise ValueError(f"--faults: {name} rate must be between 0 and 1, got {rate}")
        rates[name] = rate
    if sum(rates.values()) > 1:
        raise ValueError("--faults: the rates add up to more than 1")
    return rates


class FaultInjector:
    """`invoke_filter` for LocalEngine: decides the fate of each invocation of a worker function."""

    def __init__(self, rates: dict[str, float], functions: set[str] | None = None, seed: int = 0):
        self.rates = rates
        self.functions = functions  # None: every function
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counts = {a: 0 for a in ("ok", *ACTIONS)}

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
            self.counts[action] += 1
        return action
