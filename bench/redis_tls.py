"""GET from a real redis-server over TLS (`rediss://`, as the deployed ElastiCache exchange
requires) and over plain TCP, through RedisStore and the parsers redis-py offers:

    store    = `store.get(key)` / `store.get_range(...)`: RedisStore as the functions use it;
    hiredis  = redis-py with its hiredis parser, asked for explicitly (what RedisStore gets: hiredis
               is a pinned dependency);
    redis-py = redis-py with its pure-Python RESP2 parser (`parser_class=_RESP2Parser`).

bench/results/redis_read_paths.json holds the measurement that retired RedisStore's hand-written
raw reader (`recv_into` one buffer): it ran as the `store` path then.

Sizes: one large value (`--mb`, 44 MB = a model's update) and small ones (`--small-kb`, a
record-sized value, read `--small-n` times per repeat: per-call latency). Both servers are
throwaway `LocalRedisServer`s on loopback (the TLS one with a throwaway CA named in its URL); each
path reads the same value `--repeats` times, interleaved, after one warm-up read; MB/s = value
size / seconds (1 MB = 1e6 bytes), median and best. Also the 1/8 GETRANGE a sharded reducer
issues. Loopback: no network in the way, so this is the client's (and the server's) CPU cost per
byte, which is what differs between the paths.

    python bench/redis_tls.py [--mb 44] [--small-kb 1] [--small-n 2000] [--repeats 5] [--out FILE] [--smoke]

`--smoke`: 1 MB, 20 small GETs, 2 repeats; printed, not written.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from redis._parsers import _HiredisParser, _RESP2Parser  # noqa: E402

from bench import smoke  # noqa: E402
from smlt.local.redis_server import LocalRedisServer  # noqa: E402
from smlt.runtime.store.redis import RedisStore  # noqa: E402

PATHS = ("store", "hiredis", "redis-py")


def _time(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def _clients(url: str) -> dict[str, redis.Redis]:
    return {
        "hiredis": redis.Redis.from_url(url, parser_class=_HiredisParser),
        "redis-py": redis.Redis.from_url(url, parser_class=_RESP2Parser),
    }


def _interleaved(paths: dict[str, Callable[[], Any]], repeats: int, calls: int = 1) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):  # interleaved, so a neighbour's load hits every path alike
        for name, fn in paths.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls)
    return times


def bench_large(url: str, size: int, repeats: int) -> dict[str, dict[str, float]]:
    store = RedisStore(url, prefix="bench-tls/")
    data = os.urandom(1 << 20) * (size >> 20) + os.urandom(size % (1 << 20))
    store.put("v", data)
    key = store.prefix + "v"  # the key RedisStore wrote, for the raw clients
    clients = _clients(url)
    paths: dict[str, Callable[[], Any]] = {"store": lambda: store.get("v")}
    for name, c in clients.items():
        paths[name] = lambda c=c: c.get(key)
    for fn in paths.values():  # warm-up: connections, TLS handshakes, page faults
        assert fn() == data
    times = _interleaved(paths, repeats)
    eighth = size // 8

    def ranged(c: redis.Redis) -> Callable[[], Any]:
        def read() -> Any:
            pipe = c.pipeline(transaction=False)
            pipe.exists(key)
            pipe.getrange(key, 3 * eighth, 4 * eighth - 1)
            return pipe.execute()

        return read

    rng_paths: dict[str, Callable[[], Any]] = {"store": lambda: store.get_range("v", 3 * eighth, 4 * eighth)}
    for name, c in clients.items():
        rng_paths[name] = ranged(c)
    rng = _interleaved(rng_paths, repeats)
    store.delete("v")
    for c in [store.client, *clients.values()]:
        c.close()
    res = {}
    for name in PATHS:
        med, best = statistics.median(times[name]), min(times[name])
        res[name] = {
            "get_ms_median": round(med * 1e3, 1),
            "get_mb_s_median": round(size / med / 1e6),
            "get_mb_s_best": round(size / best / 1e6),
            "range_1_8_ms_median": round(statistics.median(rng[name]) * 1e3, 1),
        }
    return res


def bench_small(url: str, size: int, calls: int, repeats: int) -> dict[str, dict[str, float]]:
    store = RedisStore(url, prefix="bench-tls/")
    data = os.urandom(size)
    store.put("s", data)
    key = store.prefix + "s"
    clients = _clients(url)
    paths: dict[str, Callable[[], Any]] = {"store": lambda: store.get("s")}
    for name, c in clients.items():
        paths[name] = lambda c=c: c.get(key)
    for fn in paths.values():
        assert fn() == data
    times = _interleaved(paths, repeats, calls)
    store.delete("s")
    for c in [store.client, *clients.values()]:
        c.close()
    return {name: {"get_us_median": round(statistics.median(times[name]) * 1e6, 1)} for name in PATHS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=44.0, help="large value size in MB (1e6 bytes)")
    ap.add_argument("--small-kb", type=float, default=1.0, help="small value size in KB (1e3 bytes)")
    ap.add_argument("--small-n", type=int, default=2000, help="small GETs per repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the results as JSON here too")
    smoke.add_flag(ap)
    args = ap.parse_args()
    if args.smoke:
        args.mb, args.small_n, args.repeats, args.out = 1.0, 20, 2, None
    size, small = int(args.mb * 1e6), int(args.small_kb * 1e3)
    results: dict[str, Any] = {
        "value_bytes": size,
        "small_value_bytes": small,
        "small_gets_per_repeat": args.small_n,
        "repeats": args.repeats,
        "redis_py": redis.__version__,
        "hiredis": __import__("hiredis").__version__,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    for label, tls in (("tls", True), ("plain", False)):
        with LocalRedisServer(tls=tls) as srv:
            results[label] = {
                "large": bench_large(srv.url, size, args.repeats),
                "small": bench_small(srv.url, small, args.small_n, args.repeats),
            }
    print(
        f"GET on loopback, median of {args.repeats} (redis-py {results['redis_py']}, hiredis {results['hiredis']}, "
        f"load average {results['loadavg_1m']} on {results['cpus']} CPUs)"
    )
    print(f"| server | read path | GET {size / 1e6:.0f} MB ms | MB/s (median) | MB/s (best) | GETRANGE 1/8 ms "
          f"| GET {small / 1e3:g} KB µs |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for label in ("tls", "plain"):
        for name in PATHS:
            r, s = results[label]["large"][name], results[label]["small"][name]
            print(
                f"| {label} | {name} | {r['get_ms_median']} | {r['get_mb_s_median']} | {r['get_mb_s_best']} | "
                f"{r['range_1_8_ms_median']} | {s['get_us_median']} |"
            )
    for label in ("tls", "plain"):
        large, small_r = results[label]["large"], results[label]["small"]
        for other in ("hiredis", "redis-py"):
            print(
                f"{label}: store vs {other}: large GET {large['store']['get_mb_s_median'] / large[other]['get_mb_s_median']:.2f}x, "
                f"small GET {small_r[other]['get_us_median'] / small_r['store']['get_us_median']:.2f}x faster"
            )
    if args.smoke:
        smoke.report(results)
    elif args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
