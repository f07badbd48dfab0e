"""moto's AWS emulation as a threaded HTTP server on 127.0.0.1 inside this process.

- Port 0: the OS picks a free port; ``MOTO_PORT`` is then set to it, because moto's ASL
  interpreter builds its service clients with ``endpoint_url=http://localhost:{MOTO_PORT}``
  (``moto/stepfunctions/parser/asl/utils/boto_client.py``).
- Step Functions executions only run when moto's config has
  ``{"stepfunctions": {"execute_state_machine": True}}``; otherwise StartExecution just records
  an execution that never moves (``moto/stepfunctions/responses.py:get_backend``). In server mode
  the config is set through the ``/moto-api/config`` endpoint. (``SF_EXECUTION_HISTORY_TYPE``
  only shapes the canned history of the non-executing backend and is not used.)
- moto's backends and ``MOTO_PORT`` are process-global, so the engines of one process share one
  server (:func:`acquire` / :func:`release`, reference counted). When the last user releases it,
  every backend is reset (``/moto-api/reset``) and the config and ``MOTO_PORT`` are restored.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import urllib.request
from typing import Any

from . import memory

HOST = "127.0.0.1"


def _post(url: str, body: dict[str, Any] | None = None) -> bytes:
    data = json.dumps(body or {}).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback only
        return resp.read()


class MotoServer:
    def __init__(self, host: str = HOST, port: int = 0) -> None:
        self.host = host
        self._requested_port = port  # 0: the OS picks one (a console asks for a fixed one)
        self.port: int | None = None
        self._server: Any = None
        self._old_port: str | None = None
        self._old_sfn_config: dict[str, Any] | None = None

    @property
    def endpoint_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the moto server is not running")
        return f"http://{self.host}:{self.port}"

    def start(self) -> MotoServer:
        from moto.core.config import default_user_config
        from moto.server import ThreadedMotoServer

        self._old_sfn_config = dict(default_user_config.get("stepfunctions", {}))
        # werkzeug logs every request at INFO on stderr: thousands of lines per training run;
        # moto's interpreter logs every failure (even caught ones: a retried throttle) at ERROR
        # with a multi-kilobyte dump of the state's parse tree. Errors reach the user through
        # the execution history instead. Set these loggers' levels back to debug moto itself.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        logging.getLogger("moto.stepfunctions.parser.asl.component.eval_component").setLevel(logging.CRITICAL)
        server = ThreadedMotoServer(ip_address=self.host, port=self._requested_port, verbose=False)
        server.start()
        from . import patches, speed

        if patches.speedups_enabled():
            speed.nodelay(server._server)  # werkzeug's WSGI server (see smlt.local.speed, Nagle)
        self._server = server
        self.port = int(server.get_host_and_port()[1])
        self._old_port = os.environ.get("MOTO_PORT")
        os.environ["MOTO_PORT"] = str(self.port)
        _post(f"{self.endpoint_url}/moto-api/config", {"stepfunctions": {"execute_state_machine": True}})
        if not default_user_config.get("stepfunctions", {}).get("execute_state_machine"):
            raise RuntimeError("moto did not take the execute_state_machine setting")
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        from moto.core.config import default_user_config

        try:
            _post(f"{self.endpoint_url}/moto-api/reset")
        except OSError:
            pass
        memory.reset()  # the executions and objects whose data it held are gone with the reset
        self._server.stop()
        self._server = None
        if self._old_sfn_config is not None:
            default_user_config["stepfunctions"] = self._old_sfn_config  # type: ignore[typeddict-item]
        if self._old_port is None:
            os.environ.pop("MOTO_PORT", None)
        else:
            os.environ["MOTO_PORT"] = self._old_port
        self.port = None


_shared_lock = threading.Lock()
_shared: MotoServer | None = None
_users = 0


def acquire(port: int = 0) -> MotoServer:
    """The process's moto server, started on first use (on ``port``, 0: any free one)."""
    global _shared, _users
    with _shared_lock:
        if _shared is None:
            _shared = MotoServer(port=port).start()
        _users += 1
        return _shared


def release() -> None:
    """Give the server back; the last user stops (and resets) it."""
    global _shared, _users
    with _shared_lock:
        if _users <= 0:
            return
        _users -= 1
        if _users == 0 and _shared is not None:
            _shared.stop()
            _shared = None


def users() -> int:
    return _users
