"""`smlt verify RUN` on a run the real handlers made on moto (the stack's outputs stubbed)."""

import json

from smlt import cloud
from smlt.cli import main
from smlt.runtime import keys
from tests.functional.test_reconcile import ART, TABLE, aws, digits, two_rounds  # noqa: F401  (fixtures)


def stack(monkeypatch):
    found = cloud.Stack("arn:aws:states:us-east-1:123456789012:stateMachine:smlt", ART, "smlt-data", TABLE)
    monkeypatch.setattr(cloud.Stack, "lookup", classmethod(lambda cls, name, cfn=None: found))


def test_verify_passes_a_clean_run_and_fails_a_damaged_one(digits, aws, monkeypatch, capsys):  # noqa: F811
    stack(monkeypatch)
    two_rounds(digits, "cli")
    assert main(["verify", "cli"]) == 0
    # rounds 0 and 1 trained model 2; round 2 evaluated it (as `smlt run`'s summary says them)
    said = "run cli: 3 rounds (2 trained into the final model) reconciled, nothing lost or counted twice"
    assert f"{said} (8 updates applied, 0 excused)" in capsys.readouterr().out
    assert main(["verify", "cli", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.rsplit("\nrun cli:", 1)[0])["run_id"] == "cli"

    aws.delete_object(Bucket=ART, Key=keys.update_key("cli", 1, 2))
    assert main(["verify", "cli"]) == 1
    err = capsys.readouterr().err
    assert "round 1: missing_update (worker 2): applied, no update object" in err
    assert "run cli: 1 finding(s) in 3 rounds (2 trained into the final model)" in err

    # an update of a round after the last aggregated one is said, not passed over in silence
    aws.put_object(Bucket=ART, Key=keys.update_key("cli", 3, 0), Body=b"x")
    assert main(["verify", "cli"]) == 1
    assert "update objects of round(s) 3 after the last aggregated round, not reconciled" in capsys.readouterr().err


def test_verify_of_an_unknown_run_is_named(aws, monkeypatch, capsys):  # noqa: F811
    stack(monkeypatch)
    assert main(["verify", "nope"]) == 1
    assert "error: no run 'nope' in table smlt-runs" in capsys.readouterr().err
