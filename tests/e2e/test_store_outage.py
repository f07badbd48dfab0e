"""A Redis exchange outage in the middle of a sync-mode run (`--faults store_outage=S`: the
handlers reach redis-server through a proxy that cuts every connection and refuses new ones for S
seconds, as a failover looks to a client): the workers' and the aggregator's store operations
retry with backoff, and the run ends with the model it gives without the outage, bit for bit."""

from __future__ import annotations

import json

import numpy as np

from smlt.faults import FaultInjector
from smlt.runtime import keys
from smlt.runtime.store import RedisStore, S3Store
from smlt.runtime.tensors.format import decode
from tests.e2e.test_sync_mode import execute, sync_job
from tests.functional.store._fixtures import redis_server  # noqa: F401  (a real redis-server, session-wide)

OUTAGE_S = 3.0


def test_a_store_outage_mid_run_is_ridden_out_to_the_same_model(local, monkeypatch, redis_server):  # noqa: F811
    engine, names = local
    RedisStore(redis_server.url).client.flushdb()
    monkeypatch.setitem(engine._base_env, "SMLT_EXCHANGE_URL", redis_server.url)
    clean = execute(local, sync_job(), "outage-clean")

    injector = FaultInjector.from_spec(f"store_outage={OUTAGE_S:g}", functions=names.train_functions)
    injector.exchange_url = redis_server.url
    engine.invoke_filter = injector
    try:
        cut = execute(local, sync_job(), "outage-cut")
    finally:
        engine.invoke_filter = None
        injector.close()
    outage = injector.outage
    assert outage is not None and outage.down_from is not None
    assert outage.refused > 0, "the outage cut no connection: it did not happen during the run"
    assert cut["final"]["rounds"] == clean["final"]["rounds"]
    art = S3Store(names.artifacts_bucket, client=engine.client("s3"))
    a = decode(art.get(keys.final_model_key("outage-clean")))
    b = decode(art.get(keys.final_model_key("outage-cut")))
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
    print("\nstore outage:", json.dumps({"refused": outage.refused, "seconds": OUTAGE_S}))
