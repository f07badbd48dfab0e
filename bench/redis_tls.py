"""GET of one large value from a real redis-server over TLS (`rediss://`, as the deployed ElastiCache
exchange requires) and over plain TCP, through RedisStore's two read paths:

    redis-py = `store.client.get(key)`: redis-py's connection and pure-Python RESP parser (what
               RedisStore used for every rediss:// read before the raw reader learnt TLS);
    raw      = `store.get(key)`: RedisStore's raw reader (recv_into one preallocated buffer, on an
               ssl.SSLSocket for rediss://).

Both servers are throwaway `LocalRedisServer`s on loopback (the TLS one with a throwaway CA named in
its URL); each path reads the same value `--repeats` times, interleaved, after one warm-up read;
MB/s = value size / seconds (1 MB = 1e6 bytes), median and best. Also the 1/8 GETRANGE a sharded
reducer issues. Loopback: no network in the way, so this is the client's (and the server's) CPU
cost per byte, which is what differs between the paths.

    python bench/redis_tls.py [--mb 44] [--repeats 5] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smlt.local.redis_server import LocalRedisServer  # noqa: E402
from smlt.store.redis import RedisStore  # noqa: E402


def _time(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def bench_server(srv: LocalRedisServer, size: int, repeats: int) -> dict:
    store = RedisStore(srv.url, prefix="bench-tls/")
    data = os.urandom(1 << 20) * (size >> 20) + os.urandom(size % (1 << 20))
    store.put("v", data)
    key = store._k("v")
    paths = {"redis-py": lambda: store.client.get(key), "raw": lambda: store.get("v")}
    for fn in paths.values():  # warm-up: connections, TLS handshakes, page faults
        assert fn() == data
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):  # interleaved, so a neighbour's load hits both alike
        for name, fn in paths.items():
            times[name] += _time(fn, 1)
    eighth = size // 8
    pipe_range = store.client.pipeline(transaction=False)

    def redis_py_range():
        pipe_range.exists(key)
        pipe_range.getrange(key, 3 * eighth, 4 * eighth - 1)
        return pipe_range.execute()

    rng = {
        "redis-py": _time(redis_py_range, repeats),
        "raw": _time(lambda: store.get_range("v", 3 * eighth, 4 * eighth), repeats),
    }
    store.delete("v")
    store.client.close()
    res = {}
    for name in paths:
        med, best = statistics.median(times[name]), min(times[name])
        res[name] = {
            "get_ms_median": round(med * 1e3, 1),
            "get_mb_s_median": round(size / med / 1e6),
            "get_mb_s_best": round(size / best / 1e6),
            "range_1_8_ms_median": round(statistics.median(rng[name]) * 1e3, 1),
        }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=44.0, help="value size in MB (1e6 bytes)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the results as JSON here too")
    args = ap.parse_args()
    size = int(args.mb * 1e6)
    results = {
        "value_bytes": size,
        "repeats": args.repeats,
        "loadavg_1m": round(os.getloadavg()[0], 2),
        "cpus": os.cpu_count(),
    }
    for label, tls in (("tls", True), ("plain", False)):
        with LocalRedisServer(tls=tls) as srv:
            results[label] = bench_server(srv, size, args.repeats)
    print(
        f"GET of {size / 1e6:.0f} MB on loopback, median of {args.repeats} "
        f"(load average {results['loadavg_1m']} on {results['cpus']} CPUs)"
    )
    print("| server | read path | GET ms | GET MB/s (median) | GET MB/s (best) | GETRANGE 1/8 ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label in ("tls", "plain"):
        for name, r in results[label].items():
            print(
                f"| {label} | {name} | {r['get_ms_median']} | {r['get_mb_s_median']} | "
                f"{r['get_mb_s_best']} | {r['range_1_8_ms_median']} |"
            )
    for label in ("tls", "plain"):
        r = results[label]
        print(f"{label}: raw / redis-py = {r['raw']['get_mb_s_median'] / r['redis-py']['get_mb_s_median']:.1f}x")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
