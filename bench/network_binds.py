"""Where the network binds a round: a worker's load + upload seconds against its compute, for model
and shard sizes, at 1,769 and 3,008 MB.

The network is the published one (../shared/facts.md, Skyrise: ~1.2 GiB/s for ~250 ms from a
~300 MiB bucket, then ~75 MiB/s, the same at every memory size) as the simulator's token bucket
(`smlt.sim.network.Link`, refilled at the sustained rate). A steady warm round: the worker loads
the model from the bucket the last round's upload left, refilled over the gap between rounds
(GAP_S: aggregation, plan, states), trains k steps (its bucket refills), uploads its update; a
reshard round (a cache miss) also reads its shard. Compute is the planner's prior for a dense
model (`priors`: 6 FLOPs per parameter per sample, 39.7 GFLOP/s per vCPU, 0.375 ms per step,
`capacity.speed` with the prior's thread efficiency), batch 32. A round is compute-bound when its
training seconds are at least its load + upload seconds. Beside it, the planner's own round-0
prediction of the same load + upload (`TimingModel.network_seconds`, written apart from the
simulator's) as a cross-check of the two models.

Not measured here: nothing in this repository can reach Lambda's network. Writes
bench/results/network.json and the `## Network` section of bench/README.md.

    .venv/bin/python bench/network_binds.py [--smoke]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import smoke  # noqa: E402
from smlt.runtime import capacity  # noqa: E402
from smlt.runtime.planner import priors as P  # noqa: E402
from smlt.runtime.planner.timing import JobShape, TimingModel  # noqa: E402
from smlt.runtime.prices import Prices  # noqa: E402
from smlt.sim.network import GIB, MIB, Link  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "network.json"
README = ROOT / "bench" / "README.md"
LINK = Link(burst_mbps=1.2 * GIB, sustained_mbps=75.0 * MIB, bucket_mb=300.0 * MIB)  # facts.md
TIERS = (1769, 3008)
BATCH = 32
GAP_S = 2.0  # a warm worker's idle seconds between rounds (aggregation, plan, Step Functions states)
GET_S, PUT_S = 0.03, 0.05  # S3 request latency (the world draws 20-50 ms and 30-80 ms)
KS = (1, 5, 20, 100)
MODELS_MB = (1.0, 4.0, 45.0, 100.0, 200.0, 315.0, 500.0, 1000.0)  # 45 MB: ResNet-18
SHARD_MODELS_MB = (4.0, 45.0)


def step_s(model_mb: float, m: int) -> float:
    """The planner's prior seconds of one step of a dense model at m MB."""
    params = model_mb * 1e6 / 4
    flops = BATCH * P.FLOPS_PER_PARAM_GUESS * params
    speed = float(P.speed(m, P.efficiency_prior(flops)))
    return P.STEP_OVERHEAD_S + flops / (P.FLOPS_PER_VCPU * speed)


def network_s(model_mb: float, shard_mb: float, busy_s: float) -> float:
    """Load + upload seconds of a steady warm round (its bucket as the last round left it)."""
    tokens = LINK.bucket_mb
    total = 0.0
    for _ in range(4):  # rounds until the bucket at the load repeats
        load, tokens = LINK.transfer(model_mb + shard_mb, LINK.refill(tokens, GAP_S))
        up, tokens = LINK.transfer(model_mb, LINK.refill(tokens, busy_s))
        total = GET_S * (2 if shard_mb else 1) + load + PUT_S + up
    return float(total)


def planner_network_s(model_mb: float, shard_mb: float, busy_s: float) -> float:
    """The planner's round-0 prediction of the same (its priors, nothing fitted)."""
    params = int(model_mb * 1e6 / 4)
    shape = JobShape(params, 6.0 * params, True, BATCH, model_mb, model_mb, shard_mb, 1000, 10_000)
    tm = TimingModel(shape, Prices())
    miss = np.array([1.0 if shard_mb else 0.0])
    load, up = tm.network_seconds(np.array([1.0]), miss, np.array([busy_s]))
    return float(load[0] + up[0])


def fits(model_mb: float, m: int) -> bool:
    return capacity.memory_needed_mb(int(model_mb * 1e6 / 4)) <= m


def row(model_mb: float, m: int, k: int, shard_mb: float = 0.0) -> dict:
    comp = k * step_s(model_mb, m)
    net = network_s(model_mb, shard_mb, comp)
    return {
        "model_mb": model_mb,
        "shard_mb": shard_mb,
        "memory_mb": m,
        "k": k,
        "fits": fits(model_mb, m),
        "compute_s": round(comp, 4),
        "network_s": round(net, 4),
        "planner_network_s": round(planner_network_s(model_mb, shard_mb, comp), 4),
        "bound": "compute" if comp >= net else "network",
    }


def compute_bound_models(m: int, k: int, grid: np.ndarray) -> dict:
    """The model sizes (MB, of those that fit m) whose warm round is compute-bound."""
    ok = [float(x) for x in grid if fits(x, m) and k * step_s(x, m) >= network_s(x, 0.0, k * step_s(x, m))]
    largest_fit = max((float(x) for x in grid if fits(x, m)), default=0.0)
    return {
        "memory_mb": m,
        "k": k,
        "smallest_mb": min(ok) if ok else None,
        "largest_mb": max(ok) if ok else None,
        "largest_that_fits_mb": largest_fit,
    }


def largest_shard(model_mb: float, m: int, k: int, grid: np.ndarray) -> float | None:
    """The largest shard (MB) a reshard round reads and stays compute-bound."""
    comp = k * step_s(model_mb, m)
    ok = [float(s) for s in grid if comp >= network_s(model_mb, float(s), comp)]
    return max(ok) if ok else None


def measure(quick: bool) -> dict:
    grid = np.geomspace(0.01, 4000.0, 40 if quick else 400)
    shard_grid = np.geomspace(0.01, 20000.0, 40 if quick else 400)
    ks = KS[:2] if quick else KS
    models = MODELS_MB[:3] if quick else MODELS_MB
    return {
        "link": {
            "burst_mb_per_s": LINK.burst_mbps,
            "sustained_mb_per_s": LINK.sustained_mbps,
            "bucket_mb": LINK.bucket_mb,
            "gap_s": GAP_S,
            "get_s": GET_S,
            "put_s": PUT_S,
        },
        "rounds": [row(x, m, k) for x in models for m in TIERS for k in ks],
        "compute_bound_models": [compute_bound_models(m, k, grid) for m in TIERS for k in ks],
        "largest_shard_mb": [
            {"model_mb": x, "memory_mb": m, "k": k, "largest_mb": largest_shard(x, m, k, shard_grid)}
            for x in SHARD_MODELS_MB
            for m in TIERS
            for k in ks
        ],
    }


def _mb(x: float | None) -> str:
    if x is None:
        return "none"
    return f"{x:,.0f}" if x >= 10 else f"{x:.2g}"


def render(res: dict) -> str:
    rounds = {(r["model_mb"], r["memory_mb"], r["k"]): r for r in res["rounds"]}
    out = [
        "## Network",
        "",
        "`bench/network_binds.py`: where a round's load + upload outweigh its training, with the network",
        "as published (facts.md, Skyrise: ~1.2 GiB/s from a ~300 MiB bucket, then ~75 MiB/s, the same at",
        "every memory size; the simulator's token bucket, refilled at the sustained rate) and the",
        "planner's compute prior for a dense model at batch 32 (6 FLOPs per parameter and sample; a",
        "convolution does more per parameter, so its rounds are more compute-bound than these). A steady",
        "warm round: the bucket its last",
        f"upload left, refilled over {GAP_S:.0f} s between rounds and while it trains. Computed, not",
        "measured (nothing here reaches Lambda). Results: `bench/results/network.json`.",
        "",
        "Warm round, load + upload against training seconds (the planner's own round-0 prediction of the",
        "network in brackets):",
        "",
        "| model MB | memory MB | k = 1 | k = 20 | k = 100 |",
        "| --- | --- | --- | --- | --- |",
    ]
    for x in MODELS_MB:
        for m in TIERS:
            cells = []
            for k in (1, 20, 100):
                r = rounds.get((x, m, k))
                if r is None:
                    cells.append("-")
                elif not r["fits"]:
                    cells.append("does not fit")
                else:
                    cells.append(
                        f"{r['network_s']:.2f} ({r['planner_network_s']:.2f}) vs {r['compute_s']:.2f} s, {r['bound']}"
                    )
            out.append(f"| {_mb(x)} | {m:,} | " + " | ".join(cells) + " |")
    out += [
        "",
        "Model sizes whose warm round stays compute-bound (MB; below the smallest the requests' latency",
        "binds, above the largest the sustained rate does):",
        "",
        "| memory MB | k | compute-bound models (MB) | largest model that fits (MB) |",
        "| --- | --- | --- | --- |",
    ]
    for c in res["compute_bound_models"]:
        span = "none" if c["smallest_mb"] is None else f"{_mb(c['smallest_mb'])} - {_mb(c['largest_mb'])}"
        out.append(f"| {c['memory_mb']:,} | {c['k']} | {span} | {_mb(c['largest_that_fits_mb'])} |")
    out += [
        "",
        "Largest shard a reshard round (a cache miss) reads and stays compute-bound (MB):",
        "",
        "| model MB | memory MB | " + " | ".join(f"k = {k}" for k in KS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in KS) + " |",
    ]
    shards = {(s["model_mb"], s["memory_mb"], s["k"]): s["largest_mb"] for s in res["largest_shard_mb"]}
    off = [r for r in res["rounds"] if r["fits"] and r["planner_network_s"] < 0.8 * r["network_s"]]
    for x in SHARD_MODELS_MB:
        for m in TIERS:
            cells = [_mb(shards[(x, m, k)]) if (x, m, k) in shards else "-" for k in KS]
            out.append(f"| {_mb(x)} | {m:,} | " + " | ".join(cells) + " |")
    out += ["", summary(res)]
    if off:
        out += [
            "",
            f"The planner's prior is below the bucket's by more than 20 % in {len(off)} of these rounds (models of",
            f"{', '.join(_mb(x) for x in sorted({r['model_mb'] for r in off}))} MB): it assumes a full bucket at"
            f" each load, where {GAP_S:.0f} s between rounds refill only ~{LINK.sustained_mbps * GAP_S:.0f} MB of"
            " what the last upload used. It corrects itself from the run's recorded load and upload times",
            "(`tests/unit/planner/test_models.py`).",
        ]
    return "\n".join(out) + "\n"


def summary(res: dict) -> str:
    """One sentence per tier, from the results: where the network binds a warm round."""
    parts = []
    for m in TIERS:
        cb = {c["k"]: c for c in res["compute_bound_models"] if c["memory_mb"] == m}
        all_k = [k for k, c in sorted(cb.items()) if c["largest_mb"] == c["largest_that_fits_mb"]]
        short = [c for k, c in sorted(cb.items()) if c["largest_mb"] is not None and k not in all_k]
        text = f"at {m:,} MB (models up to {_mb(next(iter(cb.values()))['largest_that_fits_mb'])} MB fit)"
        if all_k:
            text += f", from k = {all_k[0]} every model that fits and is above {_mb(cb[all_k[0]]['smallest_mb'])} MB"
            text += " keeps its warm rounds compute-bound"
        if short:
            c = short[0]
            text += f"; at k = {c['k']} the sustained rate binds above {_mb(c['largest_mb'])} MB"
        parts.append(text)
    return (
        "So: "
        + "; ".join(parts)
        + ". Below the smallest size the requests' latency binds, not the bandwidth. 3,008 MB computes faster on"
        " the same network, so its rounds turn network-bound sooner."
    )


def write_readme(section: str) -> None:
    text = README.read_text()
    pattern = re.compile(r"^## Network\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(section + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + section
    README.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    smoke.add_flag(ap)
    args = ap.parse_args()
    res = measure(quick=args.smoke)
    section = render(res)
    if args.smoke:
        print(section)
        smoke.report({"rounds": len(res["rounds"]), "compute_bound_models": res["compute_bound_models"]})
        return
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    write_readme(section)
    print(section)


if __name__ == "__main__":
    main()
