"""A study in which no trial trains fails loudly: `smlt tune`'s `run` raises StudyFailed with each
trial's cause (the run's named error, unwrapped from Step Functions' JSON), and `smlt tune` refuses
such a study before any trial starts."""

import json

import pytest

from smlt import studies as tune
from smlt.cli import main
from smlt.runtime.errors import StudyFailed

from .test_study import small_study


def test_a_study_whose_every_trial_fails_raises_each_trials_named_cause(local, tmp_path):
    engine, _ = local
    # `run` itself does not pre-check (the CLI does): the trials meet the unknown parameter in their runs
    path = small_study(tmp_path, trials=2, space={"model.params.widht": {"choices": [32, 64]}})
    with pytest.raises(StudyFailed) as e:
        tune.run(tune.local_target(engine), path, tmp_path / "out", study_id="all-fail")
    assert set(e.value.causes) == {0, 1}
    for cause in e.value.causes.values():
        assert cause.startswith("FAILED: InvalidJob: ")
        assert "model.params: mlp got an unexpected keyword argument 'widht'; it takes hidden, dropout" in cause
        assert "{" not in cause  # no Step Functions JSON
    assert not (tmp_path / "out" / "model.safetensors").exists()
    doc = json.loads((tmp_path / "out" / "study.json").read_text())
    assert [t["status"] for t in doc["trials"]] == ["FAILED", "FAILED"]


def test_smlt_tune_refuses_an_unknown_parameter_before_any_engine(tmp_path, capsys):
    path = small_study(tmp_path, space={"model.params.widht": {"choices": [32]}})
    assert main(["tune", str(path), "--local", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "study.space: with model.params.widht=32" in err and "it takes hidden, dropout" in err
    assert not (tmp_path / "out").exists()
