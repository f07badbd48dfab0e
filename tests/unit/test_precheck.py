"""The client's pre-check (smlt.precheck): the job's model built once here before anything
starts; the user's own exception shown as it is, outputs checked against the dataset, memory
measured with the workers' rule, a target the untrained model (or the most common class alone) meets refused."""

import re
import textwrap

import numpy as np
import pytest

from smlt.precheck import check_model
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import InvalidCode, InvalidJob, ModelTooLarge, UserCodeError
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

class Wrapped(nn.Module):
    def __init__(self, output_dim, how):
        super().__init__()
        self.l, self.how = nn.Linear(64, output_dim), how

    def forward(self, x):
        out = self.l(x.flatten(1))
        return (out,) if self.how == "tuple" else {"logits": out, "hidden": x}

def wrapped(input_shape, output_dim, how):
    return Wrapped(output_dim, how)
"""


MORE = """
import random
import time

import numpy as np
import torch
from torch import nn


class Head(nn.Module):
    def __init__(self, output_dim, out=None, train_only=None):
        super().__init__()
        self.l = nn.Linear(64, output_dim)
        self.out, self.train_only = out, train_only

    def forward(self, x):
        if self.training and self.train_only == "view":
            x = x.view(len(x), 8, 8)
        if self.train_only == "slow" and self.training:
            time.sleep(0.05 * len(x))
        y = self.l(x.squeeze() if self.out == "squeeze" else x)
        if self.out == "int":
            return y.argmax(1, keepdim=True).repeat(1, y.shape[1])
        if self.out == "softmax":
            return torch.softmax(y, dim=1)
        if self.out == "detach":
            return y.detach()
        if self.out == "dropout":
            return nn.functional.dropout(y, 0.5, training=True)
        return y


def head(input_shape, output_dim, out=None, train_only=None):
    return Head(output_dim, out, train_only)


def bn(input_shape, output_dim):
    return nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, output_dim))


def frozen(input_shape, output_dim):
    return nn.Linear(64, output_dim).requires_grad_(False)


class Slice(nn.Module):
    def forward(self, x):
        return x[:, :10]


def noparams(input_shape, output_dim):
    return Slice()


def unseeded(input_shape, output_dim):
    m = nn.Linear(64, output_dim)
    with torch.no_grad():
        m.weight.copy_(torch.from_numpy(np.random.randn(output_dim, 64).astype("float32")))
    return m


def gpu(input_shape, output_dim):
    return nn.Linear(64, output_dim).cuda()


def elsewhere(input_shape, output_dim):
    return nn.Linear(64, output_dim, device="meta")  # as a model on a GPU of this machine would be


def reads(input_shape, output_dim, path=None, own=None):
    from pathlib import Path

    if path:
        Path(path).read_text()
    if own:  # a file it writes and reads back, and one beside its module: a worker has them too
        Path(own).write_text("x")
        Path(own).read_text()
        (Path(__file__).parent / "vocab.txt").read_text()
    return nn.Linear(64, output_dim)


class Hidden(nn.Module):
    def __init__(self, output_dim, how):
        super().__init__()
        self.head = nn.Linear(16, output_dim)
        self.how = how
        if how == "list":
            self.layers = [nn.Linear(64, 16)]
        elif how == "tensor":
            self.w = torch.randn(64, 16, requires_grad=True)
        else:  # a list of modules registered as attributes too: fine
            self.first = nn.Linear(64, 16)
            self.layers = [self.first]

    def forward(self, x):
        x = x @ self.w if self.how == "tensor" else self.layers[0](x)
        return self.head(x).log() if self.how == "nan" else self.head(x)


def hidden(input_shape, output_dim, how):
    return Hidden(output_dim, how)


class Endless(nn.Module):
    def __init__(self, output_dim):
        super().__init__()
        self.l = nn.Linear(64, output_dim)

    def forward(self, x):
        while True:
            try:
                time.sleep(0.01)
            except Exception:
                pass


def endless(input_shape, output_dim):
    return Endless(output_dim)


class Partial(nn.Module):
    def __init__(self, output_dim, how):
        super().__init__()
        self.body, self.head, self.how = nn.Linear(64, 16), nn.Linear(16, output_dim), how
        if how == "detach":
            self.unused = nn.Linear(4, 4)
        else:  # frozen as meant: fine
            self.body.requires_grad_(False)

    def forward(self, x):
        h = self.body(x)
        return self.head(h.detach() if self.how == "detach" else h)


def partial(input_shape, output_dim, how):
    return Partial(output_dim, how)


def no_return(input_shape, output_dim):
    nn.Linear(64, output_dim)


def the_class(input_shape, output_dim):
    return Slice


def to_numpy(x):
    return x.numpy()


def crop(x):
    return x[:32]


def ok(x):
    return x * 1.0
"""


@pytest.fixture
def code(user_package):
    syntax = "def build(input_shape, output_dim):\n    return nn.Linear(3 output_dim)\n"
    return user_package("usernets", nets=NETS, more=MORE, syntax=syntax)


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


@pytest.mark.parametrize(
    "how, said",
    [
        ("tuple", "returned tuple of 1 tensor from its forward pass, not a tensor: return the logits tensor alone"),
        (
            "dict",
            "returned dict with keys ['logits', 'hidden'] from its forward pass, not a tensor: return the logits "
            "tensor alone (`return out['logits']`; a Hugging Face model's `.logits`)",
        ),
    ],
)
def test_outputs_wrapped_in_a_tuple_or_dict_say_to_return_the_logits(digits, code, how, said):
    j = parse_job({"dataset": {"uri": "unused"}, "model": {"name": "usernets.nets:wrapped", "params": {"how": how}}})
    with pytest.raises(InvalidJob) as e:
        check_model(j, digits, code)
    assert said in str(e.value)


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


def more(name, params=None, transform=None, **training):
    raw = {"dataset": {"uri": "unused"}, "model": {"name": f"usernets.more:{name}", "params": params or {}}}
    if transform:
        raw["code"] = {"transform": f"usernets.more:{transform}"}
    return parse_job({**raw, "training": training})


@pytest.mark.parametrize(
    "out, words",
    [
        ("int", r"gives int64 outputs; smlt's loss needs floating-point logits \(one per class\) with a gradient"),
        ("softmax", r"ends in a softmax: its outputs are probabilities .* return the last layer's output without"),
        ("squeeze", r"gives outputs of shape \(10,\) for a batch of 1 sample; .* x.squeeze\(\) drops its batch"),
        ("detach", r"gives outputs that do not depend on its trainable parameters .* leave out .detach\(\)"),
    ],
)
def test_outputs_training_cannot_use_are_refused_naming_the_mistake(digits, code, out, words):
    """An int64 (argmax) output, a softmax's probabilities, a squeeze() that drops a one-row batch's
    dimension (a last validation batch may hold one row), an output cut off its gradient: each
    trained, or failed mid-run blamed on the data, before."""
    with pytest.raises(InvalidJob, match=rf"model.name: 'usernets.more:head' {words}"):
        check_model(more("head", {"out": out}), digits, code)


def test_what_fails_only_in_training_mode_is_the_users_error_with_their_frame(digits, code):
    with pytest.raises(UserCodeError) as e:
        check_model(more("head", {"train_only": "view"}), digits, code)
    assert e.value.where.startswith("a training step of model.name 'usernets.more:head' (training mode")
    assert e.value.type == "RuntimeError" and e.value.frames[-1].startswith("usernets/more.py:")
    assert "in forward: y = self.l(" in e.value.frames[-1]


def test_batch_norm_with_a_batch_size_of_one_is_refused_before_any_worker(digits, code):
    check_model(more("bn"), digits, code)  # the job's batch of 32: fine
    with pytest.raises(UserCodeError) as e:
        check_model(more("bn", batch_size=1), digits, code)
    assert e.value.where.endswith("on a batch of 1") and "Expected more than 1 value per channel" in e.value.message
    assert e.value.message.endswith(
        "(batch norm needs 2 or more rows per training batch: set training.batch_size to at least 2)"
    )


@pytest.mark.parametrize(
    "name, words",
    [
        ("frozen", "has 650 parameters and every one is frozen (requires_grad=False)"),
        ("noparams", "has no parameters"),
    ],
)
def test_a_model_with_nothing_to_train_is_refused(digits, code, name, words):
    with pytest.raises(InvalidJob) as e:
        check_model(more(name), digits, code)
    assert str(e.value).startswith(f"model.name: 'usernets.more:{name}' {words}, so training would not change it")


@pytest.mark.parametrize(
    "transform, words",
    [
        ("to_numpy", "returned numpy.ndarray for a sample, not a torch.Tensor"),
        ("crop", "turns a sample of shape (64,) (float32) into (32,) (float32); it runs on training samples only"),
    ],
)
def test_a_transform_must_give_a_tensor_of_the_samples_shape(digits, code, transform, words):
    with pytest.raises(InvalidJob) as e:
        check_model(more("head", transform=transform), digits, code)
    assert str(e.value).startswith(f"code.transform: 'usernets.more:{transform}' {words}")
    check_model(more("head", transform="ok"), digits, code)


def test_a_training_step_longer_than_a_worker_may_run_is_refused(digits, code, monkeypatch):
    import smlt.precheck

    # 0.05 s a row: 1.6 s for a batch of 32, more than 0.8 of a 1 s timeout
    monkeypatch.setattr(smlt.precheck, "_worker_timeout_s", lambda: 1.0)
    with pytest.raises(InvalidJob) as e:
        check_model(more("head", {"train_only": "slow"}, batch_size=32), digits, code)
    text = str(e.value)
    assert re.search(r"takes 0\.1\d* s for one training step on 2 samples here, so about 2 s for a batch of 32", text)
    assert "more than a worker may run (1 s, 0.8 of the 1 s Lambda timeout)" in text
    assert re.search(r"lower training.batch_size to at most 1[0-5], or make the forward", text), text
    check_model(more("head", {"train_only": "slow"}, batch_size=8), digits, code)  # 0.4 s


def test_a_builder_or_forward_that_is_not_repeatable_is_told(digits, code, caplog):
    """They train (every worker starts from the one stored model 0), so a warning, not a refusal."""
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(more("unseeded"), digits, code)
        check_model(more("head", {"out": "dropout"}), digits, code)
        check_model(more("head"), digits, code)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said
    assert said[0].startswith("model.name: 'usernets.more:unseeded' builds different weights each time")
    assert said[1].startswith("model.name: 'usernets.more:head' gives different outputs for the same samples")


def test_a_model_asking_for_a_gpu_is_told_the_workers_have_none(digits, code):
    """Without CUDA here, .cuda() raises: its message gets what to do. With a GPU here, it builds,
    and the weights' device is refused (`elsewhere` stands for it on any machine)."""
    with pytest.raises((UserCodeError, InvalidJob)) as e:
        check_model(more("gpu"), digits, code)
    assert "the workers run on CPU" in str(e.value) and "Lambda has no GPU" in str(e.value)
    with pytest.raises(InvalidJob) as e:
        check_model(more("elsewhere"), digits, code)
    assert str(e.value).startswith(
        "model.name: 'usernets.more:elsewhere' puts its weights on meta, but the workers run on CPU (Lambda has no GPU)"
    )


def test_a_file_of_this_machine_the_code_reads_is_refused_for_the_stack_and_told_locally(
    digits, code, tmp_path, caplog
):
    laptop = tmp_path / "home" / "vocab.txt"
    laptop.parent.mkdir()
    laptop.write_text("a b c")
    (code / "vocab.txt").write_text("a b c")
    job = more("reads", {"path": str(laptop)})
    with pytest.raises(InvalidCode) as e:
        check_model(job, digits, code, deployed=True)
    assert str(e.value).startswith(f"code: your code reads a file of this machine: {laptop} (usernets/more.py:")
    assert "in reads); the workers do not have it: put small files in the code folder (--code DIR" in str(e.value)
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(job, digits, code)  # a local run's handlers read this machine's files
        check_model(more("reads", {"own": str(tmp_path / "written.txt")}), digits, code, deployed=True)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].endswith(
        "(a local run reads this machine's files, so it runs; the deployed stack would not)"
    )


@pytest.mark.parametrize(
    "how, words",
    [
        (
            "list",
            "holds modules in a plain list (self.layers): PyTorch does not see their parameters, so training "
            "never changes them and the model file leaves them out: hold them in nn.ModuleList",
        ),
        (
            "tensor",
            "holds a tensor that requires grad as a plain attribute (self.w, (64, 16)): PyTorch does not "
            "see it, so training never changes it and the model file leaves it out: make it an nn.Parameter",
        ),
        ("nan", "gives NaN or Inf outputs for validation samples before any training (their inputs are finite;"),
    ],
)
def test_weights_training_never_sees_and_outputs_not_finite_untrained_are_refused(digits, code, how, words):
    """A plain list of layers and a plain tensor trained on digits to 0.11 accuracy, exit 0; a log of
    negative values failed the run as Diverged, telling to lower the learning rate."""
    with pytest.raises(InvalidJob) as e:
        check_model(more("hidden", {"how": how}), digits, code)
    assert str(e.value).startswith(f"model.name: 'usernets.more:hidden' {words}")


def test_a_list_of_modules_that_are_registered_too_is_fine(digits, code):
    check_model(more("hidden", {"how": "alias"}), digits, code)


def test_a_forward_that_never_ends_is_stopped_and_named_where(digits, code, monkeypatch):
    """It hung `smlt run --local` (and `smlt start`) silently, before any engine or stack: no output, ever."""
    import smlt.precheck

    monkeypatch.setattr(smlt.precheck, "MIN_CALL_S", 0.5)
    monkeypatch.setattr(smlt.precheck, "_worker_timeout_s", lambda: 1.0)
    with pytest.raises(InvalidJob) as e:
        check_model(more("endless"), digits, code)
    text = str(e.value)
    assert text.startswith(
        "the forward pass of model.name 'usernets.more:endless' on 2 samples of shape 64: did not finish in 0.5 s "
        "(stopped at usernets/more.py:"
    ), text
    assert "in forward: time.sleep(0.01)): an endless loop, a sleep or a read that waits? A worker gives one " in text


def test_parameters_no_gradient_reaches_are_told(digits, code, caplog):
    """A body cut off by .detach() (or torch.no_grad()) trained its head only, exit 0, unsaid (digits:
    0.61 accuracy after 3 rounds where the whole model reaches 0.84); every parameter cut off is refused."""
    with caplog.at_level("WARNING", logger="smlt.notice"):
        check_model(more("partial", {"how": "detach"}), digits, code)
        check_model(more("partial", {"how": "frozen"}), digits, code)
    said = [r.getMessage() for r in caplog.records if "no gradient" in r.getMessage()]
    assert said == [
        "model.name: 'usernets.more:partial': 1,060 of its 1,230 trainable parameters get no gradient from a training "
        "step (body.weight, body.bias, unused.weight and 1 more), so training never changes them and the run trains "
        "the rest only: a .detach() or torch.no_grad() in forward, or layers forward does not use? Freeze what "
        "should stay as built (requires_grad_(False)) and this is not told"
    ]


@pytest.mark.parametrize(
    "name, words",
    [
        ("no_return", "returned None (a missing return statement?), not a torch.nn.Module"),
        ("the_class", "returned the class Slice itself (return an instance: Slice(...)), not a torch.nn.Module"),
    ],
)
def test_a_builder_that_returns_no_module_says_what_it_returned(digits, code, name, words):
    """It said "returned NoneType" and "returned type"."""
    with pytest.raises(InvalidJob) as e:
        check_model(more(name), digits, code)
    assert str(e.value) == f"model.name: 'usernets.more:{name}' {words}"
