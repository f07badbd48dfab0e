"""The round's Map, inline against Distributed, at 8, 40 and 200 workers: per-round latency of the
Map itself, its Step Functions transitions and their price, and its history events in the parent.

From the model (`smlt.runtime.fanout`, cdk.json's `fanout` priors and prices), not measured: AWS offers
no way to run either here. Sources of the priors are in smlt/runtime/fanout.py and ../shared/facts.md.
An inline Map runs at most 40 iterations at once, so above 40 its workers go in waves: the table
shows that with a worker time of WORKER_S seconds. Prints the Markdown table of
docs/architecture.md ("The round's Map").

    .venv/bin/python bench/map_choice.py [--smoke]

It computes in milliseconds: `--smoke` prints the same table and its row count as smoke results.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import smoke  # noqa: E402 - needs ROOT on the path when run as a script
from smlt.runtime.config import FunctionSizes  # noqa: E402
from smlt.runtime.fanout import (  # noqa: E402
    DISTRIBUTED_TRANSITIONS_PER_WORKER,
    INLINE_EVENTS_PER_WORKER,
    INLINE_MAX,
    INLINE_TRANSITIONS_PER_WORKER,
)
from smlt.runtime.prices import Prices  # noqa: E402

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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    smoke.add_flag(ap)
    table = rows()
    print("\n".join(table))
    if ap.parse_args().smoke:
        smoke.report({"rows": len(table) - 2})


if __name__ == "__main__":
    main()
