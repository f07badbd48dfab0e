"""A local run's saved state (smlt.snapshot) keeps the ATTEMPT item a straggler writes when it
ends, rounds after its own round was saved with the aggregator's estimate of it (900 s): a crash
before the run's last save used to lose that item, so a resumed run billed the estimate."""

import json
from types import SimpleNamespace

import boto3

from smlt.runtime import ledger
from smlt.runtime.records import RunTable
from smlt.snapshot import Snapshot
from tests.functional.handlers.conftest import aws  # noqa: F401  (the moto fixture)

TABLE = "smlt-runs"


class _Engine:
    def client(self, name):
        return boto3.client(name)


def _attempt(rnd, worker, request, **extra):
    item = ledger.AttemptItem(function="f", memory_mb=1769, round=rnd, worker=worker, request_id=request, **extra)
    return f"{ledger.round_prefix(rnd)}{request}", item


def test_a_stragglers_late_item_is_saved_as_it_lands(aws, tmp_path):  # noqa: F811
    names = SimpleNamespace(table=TABLE, artifacts_bucket="smlt-artifacts", data_bucket="smlt-data")
    snap = Snapshot(_Engine(), names, "r", tmp_path)
    table = RunTable(TABLE, "r")
    # round 4 saved with worker 0 estimated (abandoned: States.Timeout, priced at 900 s)
    estimate = _attempt(4, 0, "estimated-4-0", duration_s=900.0, outcome="States.Timeout", estimated=True)
    table.put_once(*estimate)
    saved = table.query(ledger.round_prefix(4))
    snap.newest, snap._meta = 4, {"pk": table.pk, "sk": "META"}
    snap._file.write(snap._meta, saved)
    snap.saved.update(i["sk"] for i in saved)
    snap._note_attempts(saved)
    # two rounds on, the straggler ends and writes its own item of round 4
    for rnd in (5, 6):
        table.put_once(*_attempt(rnd, 1, f"w-{rnd}", duration_s=2.0))
        snap.newest = rnd - 1
        snap.save_in_flight()
    late_sk, late = _attempt(4, 0, "late", duration_s=13.0, outcome="StaleInvocation")
    table.put_once(late_sk, late)
    snap.save_in_flight()  # as after any invocation
    on_disk = {i["sk"]: i for i in json.loads((tmp_path / "items.json").read_text())}
    assert late_sk in on_disk and snap._standing == set()
    billed = ledger.from_items(i for sk, i in on_disk.items() if sk.startswith(ledger.round_prefix(4)))
    assert [(a.worker, a.duration_s, a.estimated) for a in billed] == [(0, 13.0, False)]
