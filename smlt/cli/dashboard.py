"""`smlt dashboard`: serve the web page over a deployed stack or the local console."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def add_command(sub: Any) -> None:
    d = sub.add_parser("dashboard", help="serve a web page of the runs and studies (deployed stack or local console)")
    d.add_argument("--stack", default=None, help="CloudFormation stack name (default: Smlt, or the console's)")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="read the local console (`smlt local up`)")
    where.add_argument("--endpoint-url", help="an AWS-compatible endpoint (default: AWS, or AWS_ENDPOINT_URL)")
    d.add_argument("--state", type=Path, help="with --local: the console's state folder")
    d.add_argument("--host", default="127.0.0.1", help="address to serve on (default 127.0.0.1)")
    d.add_argument("--port", type=int, default=8050, help="port to serve on (default 8050)")
    d.add_argument("--interval", type=float, default=2.0, help="seconds between polls of a live run (default 2)")
    d.set_defaults(fn=dashboard)


def dashboard(args: argparse.Namespace) -> int:
    from smlt.extras import require

    require("dashboard", "smlt dashboard")
    from smlt.dashboard.app import make_app, serve
    from smlt.dashboard.data import Source
    from smlt.runtime.progress import notice

    endpoint, region, stack = args.endpoint_url, None, args.stack or "Smlt"
    if args.local:
        from smlt.console import ConsoleError, default_state_dir, read_info

        state = args.state or default_state_dir()
        info = read_info(state)
        if info is None:
            raise ConsoleError(f"--local: no console is up with --state {state}; start one with `smlt local up`")
        endpoint, region, stack = info.endpoint_url, info.region, args.stack or info.stack
        for k, v in info.environment().items():  # the console's dummy credentials, for boto3
            os.environ.setdefault(k, v)
    source = Source.open(stack, endpoint_url=endpoint, region=region)
    server = serve(make_app(source, interval_s=args.interval), args.host, args.port)
    notice.info(f"dashboard of {source.label} on http://{args.host}:{server.server_port}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
