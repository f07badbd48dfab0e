"""The local engine's moto server in a process of its own, with or without smlt.local.speed's
patches (``SMLT_LOCAL_SPEEDUPS=0`` or ``1``: the patches are process-wide), for the benchmarks
that compare the two (bench/moto_calls.py, bench/aggregation_bench.py).

Run as a script it is the child: it prints its port and serves until its stdin closes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def serve() -> None:
    """Child: the local engine's moto server (with or without the patches); prints its port."""
    sys.path.insert(0, str(ROOT))
    from smlt.local import patches, server

    patches.install()  # the speed patches unless SMLT_LOCAL_SPEEDUPS=0
    srv = server.MotoServer().start()
    print(srv.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    srv.stop()


def start_server(mode: str) -> tuple[subprocess.Popen, str]:
    env = {
        **os.environ,
        "SMLT_LOCAL_SPEEDUPS": mode,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    p = subprocess.Popen([sys.executable, __file__], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p, f"http://127.0.0.1:{int(p.stdout.readline())}"


def stop_server(p: subprocess.Popen) -> None:
    p.stdin.close()
    try:
        p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()


if __name__ == "__main__":
    serve()
