"""The reconciliation's ledger check (smlt.reconcile, `unbilled`): a worker record whose
invocation left no ATTEMPT item (smlt.runtime.ledger) is a finding; the handlers' own run has none."""

from smlt.runtime import ledger
from smlt.runtime.records import RunTable
from tests.functional.handlers import conftest as handlers
from tests.functional.test_reconcile import TABLE, check, kinds, two_rounds

aws, digits = handlers.aws, handlers.digits  # the handlers' moto fixtures


def test_every_worker_record_is_billed_and_a_missing_attempt_is_reported(digits, aws):
    two_rounds(digits, "billed")  # no finding: every worker's invocation left its ATTEMPT item
    table = RunTable(TABLE, "billed")
    mine = [a for a in table.query(ledger.round_prefix(1)) if a.get("worker") == 2]
    assert mine
    for a in mine:
        table.client.delete_item(TableName=TABLE, Key={"pk": {"S": a["pk"]}, "sk": {"S": a["sk"]}})
    assert kinds(check("billed"), 1) == {("unbilled", 2)}
