"""The Redis store under an outage: an operation that meets a lost connection retries with
backoff and succeeds once the server answers again; past `outage_s` it is StoreUnavailable,
naming the store. The outage is real: a TCP proxy (smlt.faults.StoreOutage) cuts and refuses
every connection to a real redis-server."""

from __future__ import annotations

import socket
import time

import pytest

from smlt.faults import StoreOutage
from smlt.runtime.errors import StoreUnavailable
from smlt.runtime.store import RedisStore
from tests.functional.store._fixtures import redis_server  # noqa: F401  (a real redis-server, session-wide)


def test_an_operation_during_an_outage_waits_for_the_store_and_succeeds(redis_server):  # noqa: F811
    proxy = StoreOutage(redis_server.url, seconds=1.5, delay_s=0.2)
    try:
        store = RedisStore(proxy.url, prefix="outage-test/", outage_s=30)
        store.put("k", b"before")  # the first connection: the outage starts 0.2 s later
        time.sleep(0.4)
        assert proxy.down()
        t0 = time.monotonic()
        store.put("k", b"during")
        assert store.get("k") == b"during"
        assert time.monotonic() - t0 >= 0.8  # it waited for the store to come back
        assert proxy.refused > 0
    finally:
        proxy.close()


def test_a_store_that_stays_down_is_store_unavailable_naming_it():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = RedisStore(f"redis://127.0.0.1:{port}/0", outage_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(StoreUnavailable) as e:
        store.get("k")
    assert 0.5 <= time.monotonic() - t0 < 10
    assert f"127.0.0.1:{port}" in str(e.value) and "smlt resume" in str(e.value)
