"""The client's pre-check (smlt.precheck): the job's model built once here before anything
starts; the user's own exception shown as it is, outputs checked against the dataset, memory
measured with the workers' rule, a target the untrained model (or the most common class alone) meets refused."""

import textwrap

import numpy as np
import pytest

from smlt.precheck import check_model
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidJob, ModelTooLarge, UserCodeError
from smlt.runtime.job import parse_job

NETS = """
from torch import nn

def helper(n):
    return n + "x"

def broken(input_shape, output_dim):
    return nn.Linear(helper(input_shape[0]), output_dim)

def wide(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, output_dim + 2))

def narrow(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, output_dim - 3))

class Bad(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(10, 10)

    def forward(self, x):
        return self.l(x.flatten(1))

def badfwd(input_shape, output_dim):
    return Bad()

def ok(input_shape, output_dim):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, output_dim))
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    prepare_dataset("sklearn:digits", str(folder), shards=2)
    return folder


@pytest.fixture
def code(tmp_path):
    pkg = tmp_path / "code" / "usernets"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "nets.py").write_text(NETS)
    (pkg / "syntax.py").write_text("def build(input_shape, output_dim):\n    return nn.Linear(3 output_dim)\n")
    return pkg


def job(model, **training):
    return parse_job({"dataset": {"uri": "unused"}, "model": {"name": model}, "training": training})


def test_the_builders_own_type_error_is_shown_with_its_frames_not_blamed_on_the_params(digits, code):
    with pytest.raises(UserCodeError) as e:
        check_model(job("usernets.nets:broken"), digits, code)
    assert e.value.type == "TypeError"
    assert "unsupported operand type(s) for +: 'int' and 'str'" in e.value.message
    assert e.value.frames[0].startswith("usernets/nets.py:8 in broken: return nn.Linear(helper(input_shape[0])")
    assert e.value.frames[-1] == 'usernets/nets.py:5 in helper: return n + "x"'
    assert "model.params" not in str(e.value)


def test_a_syntax_error_names_the_file_and_line(digits, code):
    with pytest.raises(UserCodeError) as e:
        check_model(job("usernets.syntax:build"), digits, code)
    assert e.value.type == "SyntaxError" and "line 2" in e.value.message
    assert e.value.frames == ["usernets/syntax.py:2: return nn.Linear(3 output_dim)"]


@pytest.mark.parametrize("name, got, word", [("wide", 12, "too many"), ("narrow", 7, "too few")])
def test_too_many_or_too_few_outputs_are_refused_naming_both_numbers(digits, code, name, got, word):
    with pytest.raises(InvalidJob, match=rf"gives {got} outputs per sample, but digits has 10 classes: {word}"):
        check_model(job(f"usernets.nets:{name}"), digits, code)


def test_a_forward_pass_error_is_the_users_with_the_frame_of_their_forward(digits, code):
    with pytest.raises(UserCodeError) as e:
        check_model(job("usernets.nets:badfwd"), digits, code)
    assert e.value.type == "RuntimeError" and "mat1 and mat2 shapes cannot be multiplied" in e.value.message
    assert e.value.frames == ["usernets/nets.py:22 in forward: return self.l(x.flatten(1))"]


def test_a_good_model_passes_and_leaves_no_module_of_the_code_behind(digits, code):
    import sys

    check_model(job("usernets.nets:ok"), digits, code)
    assert not [m for m in sys.modules if m.startswith("usernets")]


def test_a_built_in_that_cannot_take_the_samples_is_named(digits):
    with pytest.raises(
        InvalidJob, match=r"model.name: lenet takes images .* this dataset's samples have shape \(64,\)"
    ):
        check_model(job("lenet"), digits)


def test_a_model_that_fits_lambda_but_no_deployed_tier_names_the_tier_it_needs(digits, code, tmp_path):
    big = tmp_path / "bigcode" / "bignets"
    big.mkdir(parents=True)
    (big / "__init__.py").write_text(
        textwrap.dedent("""
        from torch import nn

        def build(input_shape, output_dim):
            return nn.Sequential(nn.Flatten(), nn.Linear(64, 12000), nn.Linear(12000, 12000), nn.Linear(12000, output_dim))
        """)
    )
    with pytest.raises(ModelTooLarge, match=r"more than the deployed memory tiers \(1769, 3008 MB\): deploy a tier"):
        check_model(job("bignets:build"), digits, big)


def test_a_regression_target_in_raw_units_met_by_the_untrained_model_is_refused(tmp_path):
    folder = tmp_path / "diabetes"
    prepare_dataset("sklearn:diabetes", str(folder), shards=2)
    j = parse_job(
        {"dataset": {"uri": "unused"}, "training": {"target_metric": "val_loss", "target_value": 3558}, "seed": 0}
    )
    with pytest.raises(InvalidJob) as e:
        check_model(j, folder)
    text = str(e.value)
    assert text.startswith("training.target_value: the untrained model already meets val_loss <= 3558")
    assert "standardised targets" in text and "use val_rmse" in text
    ok = parse_job({"dataset": {"uri": "unused"}, "training": {"target_metric": "val_rmse", "target_value": 50}})
    check_model(ok, folder)  # a raw-unit RMSE target the untrained model does not meet


def test_an_accuracy_target_the_most_common_class_alone_reaches_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    rows = [f"{rng.normal():.3f},{rng.normal():.3f},{int(i % 25 == 0)}" for i in range(1000)]  # 4 % ones
    (tmp_path / "fraud.csv").write_text("a,b,fraud\n" + "\n".join(rows) + "\n")
    prepare_dataset(str(tmp_path / "fraud.csv"), str(tmp_path / "f"), shards=2)

    def job_with(target):
        return parse_job(
            {"dataset": {"uri": "unused"}, "training": {"target_metric": "val_accuracy", "target_value": target}}
        )

    with pytest.raises(InvalidJob) as e:
        check_model(job_with(0.95), tmp_path / "f")
    text = str(e.value)
    assert text.startswith(
        "training.target_value: val_accuracy 0.95 is met by always predicting the most common class '0' (9"
    )
    assert "of 200 validation rows)" in text and "set a target above 0.9" in text
    check_model(job_with(0.99), tmp_path / "f")  # above the majority's share: the model must learn


@pytest.mark.parametrize("cmd", [["run", "--local"], ["start"]])
def test_the_cli_shows_the_users_error_before_any_engine_or_stack(digits, code, tmp_path, capsys, cmd):
    import json

    from smlt.cli import main

    path = tmp_path / "job.json"
    path.write_text(json.dumps({"dataset": {"uri": str(digits)}, "model": {"name": "usernets.nets:broken"}}))
    out = tmp_path / "out"
    assert main([*cmd, str(path), "--code", str(code), *(["--out", str(out)] if "run" in cmd else [])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: UserCodeError: building model.name 'usernets.nets:broken': your code raised TypeError"
    )
    assert 'usernets/nets.py:5 in helper: return n + "x"' in err
    assert not out.exists()  # no engine, no state
