"""Per-request costs of moto 5.2.5 that the local engine pays on every round, removed with small,
documented monkeypatches (same answers, less work). Refused on any other moto version, and every
patched attribute is looked up first: an upgrade that moves them fails loudly.

Measured with ``bench/local_bench.py``'s overhead probe (8 workers, no-op compute) and py-spy on
the engine's process: about two thirds of that process's busy time was moto's HTTP server, and
every handler's S3/DynamoDB call waits on it.

1. *Service routing*: ``DomainDispatcherApplication.get_backend_for_host`` lists moto's package
   directory (``os.listdir`` + ``isdir`` of ~190 entries) and then tries hundreds of URL regexes
   on every request, under the dispatcher's lock, to map a host name to a backend. The mapping
   is a pure function of the host (the patterns are fixed when the app is built): it is
   memoised per dispatcher.
2. *Lambda clients of the interpreter*: ``boto_client_for`` builds a new boto3 client (service
   model, endpoint resolver, an SSL context...) for every Lambda task the interpreter runs. The
   client it builds depends only on (region, service, whether moto's in-process stubber is on,
   ``MOTO_PORT``), and botocore clients are thread-safe: one is kept per key. (The credentials
   argument is ignored by moto's function too.)
3. *JSONPath parsing*: ``jsonpath_ng.ext.parse`` builds a new PLY parser (reading its LR tables)
   for every path the interpreter evaluates (InputPath, Parameters ``.$`` fields, ResultSelector,
   ResultPath, Choice variables...). Parsed expressions are immutable; they are cached per path
   string in the two modules that parse.
4. *Nagle*: werkzeug writes a response's headers and body with separate ``send`` calls on an
   unbuffered socket; with Nagle's algorithm on, the body waits for the client's (delayed) ACK of
   the headers. The server's accepted sockets get ``TCP_NODELAY`` (as urllib3 already sets on
   the client side); see :func:`nodelay` (applied by ``server.MotoServer.start``).
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Any

from .limits import MOTO_VERSION, MotoVersionError

_lock = threading.Lock()
_installed = False


def enabled() -> bool:
    """``SMLT_LOCAL_SPEEDUPS=0`` turns these patches off (to measure what they save; set it
    before the engine starts, in a fresh process)."""
    return os.environ.get("SMLT_LOCAL_SPEEDUPS", "1") != "0"


def _check_version() -> None:
    import moto

    if moto.__version__ != MOTO_VERSION:
        raise MotoVersionError(f"smlt.local.speed patches moto {MOTO_VERSION}; found moto "
                               f"{moto.__version__} (re-check the patched functions, then update)")


def install() -> None:
    global _installed
    with _lock:
        if _installed:
            return
        _check_version()
        _patch_backend_for_host()
        _patch_boto_client_for()
        _patch_jsonpath_parse()
        _installed = True


def _patch_backend_for_host() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    orig = DomainDispatcherApplication.get_backend_for_host

    @functools.wraps(orig)
    def get_backend_for_host(self: Any, host: str | None) -> Any:
        if host is None:
            return None
        cache = self.__dict__.setdefault("_smlt_backend_for_host", {})
        try:
            return cache[host]
        except KeyError:
            backend = orig(self, host)
            cache[host] = backend
            return backend

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host


def _patch_boto_client_for() -> None:
    from moto.core.models import botocore_stubber
    from moto.settings import moto_server_port
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
    from moto.stepfunctions.parser.asl.utils import boto_client

    orig = boto_client.boto_client_for
    if lambda_eval_utils.boto_client_for is not orig:
        raise MotoVersionError("moto's lambda_eval_utils no longer uses boto_client_for")
    clients: dict[tuple[str, str, bool, str], Any] = {}
    clients_lock = threading.Lock()

    @functools.wraps(orig)
    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        key = (region, service, bool(botocore_stubber.enabled), str(moto_server_port()))
        c = clients.get(key)
        if c is None:
            with clients_lock:
                c = clients.get(key)
                if c is None:
                    c = clients[key] = orig(region=region, service=service,
                                            state_credentials=state_credentials)
        return c

    # Only the Lambda task path: other integrations keep moto's own behaviour.
    lambda_eval_utils.boto_client_for = boto_client_for


def _patch_jsonpath_parse() -> None:
    from moto.stepfunctions.parser.asl.component.common.path import result_path
    from moto.stepfunctions.parser.asl.utils import json_path

    for module in (json_path, result_path):
        orig = module.parse  # AttributeError if moto moved it: fail loudly
        module.parse = functools.lru_cache(maxsize=4096)(orig)


def nodelay(wsgi_server: Any) -> None:
    """Set TCP_NODELAY on every connection ``wsgi_server`` (a ``socketserver.TCPServer``) accepts."""
    orig = wsgi_server.get_request

    def get_request() -> tuple[socket.socket, Any]:
        conn, addr = orig()
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return conn, addr

    wsgi_server.get_request = get_request
