"""The round's Map, inline against Distributed, at 8, 40 and 200 workers: per-round latency of the
Map itself, its Step Functions transitions and their price, and its history events in the parent.

From the model (`smlt.runtime.fanout`, cdk.json's `fanout` priors and prices), not measured: AWS offers
no way to run either here. Sources of the priors are in smlt/runtime/fanout.py and ../shared/facts.md.
An inline Map runs at most 40 iterations at once, so above 40 its workers go in waves: the table
shows that with a worker time of WORKER_S seconds. Prints the Markdown table of
docs/architecture.md ("The round's Map").

    .venv/bin/python bench/map_choice.py
"""

from __future__ import annotations

import math

from smlt.runtime.config import FunctionSizes
from smlt.runtime.fanout import (
    DISTRIBUTED_TRANSITIONS_PER_WORKER,
    INLINE_EVENTS_PER_WORKER,
    INLINE_MAX,
    INLINE_TRANSITIONS_PER_WORKER,
)
from smlt.runtime.prices import Prices

WORKER_S = 30.0  # a worker's handler time, for the inline Map's waves above 40 workers


def rows() -> list[str]:
    f = FunctionSizes().fanout
    price = Prices().sfn_transition
    out = [
        "| workers | Map | Map's own seconds | extra waves (30 s workers) | transitions | their price | parent history events |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for n in (8, 40, 200):
        chosen = f.kind(n)
        for kind in ("inline", "distributed"):
            if kind == "inline":
                own = (n - 1) * f.inline_per_worker_s if n <= INLINE_MAX else (INLINE_MAX - 1) * f.inline_per_worker_s
                waves = max(0, math.ceil(n / INLINE_MAX) - 1)
                transitions, events = INLINE_TRANSITIONS_PER_WORKER * n, INLINE_EVENTS_PER_WORKER * n
            else:
                own = f.distributed_overhead_s + n * f.distributed_per_worker_s
                waves, transitions, events = 0, DISTRIBUTED_TRANSITIONS_PER_WORKER * n, 0
            mark = " (chosen)" if kind == chosen else ""
            extra = f"+{waves * WORKER_S:.0f} s" if waves else "0"
            out.append(
                f"| {n} | {kind}{mark} | {own:.1f} s | {extra} | {transitions} | ${transitions * price:.4f} | {events} |"
            )
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
