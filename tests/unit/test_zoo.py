"""The model zoo: every built-in builds for its inputs, trains a step, is deterministic for a seed,
and misuse is an InvalidJob naming the model and what it takes."""

import typing

import pytest
import torch
from torch import nn

from smlt.runtime.errors import InvalidJob
from smlt.runtime.job import BUILTIN_MODELS, ModelSpec, TrainingSpec
from smlt.runtime.train import models as registry
from smlt.runtime.train.models import build_model

VOCAB = 50
# name -> (one sample's shape, vocab_size or None for float input)
CASES = {
    "mlp": ((1, 8, 8), None),
    "logreg": ((12,), None),
    "lenet": ((1, 8, 8), None),
    "resnet18": ((3, 32, 32), None),
    "resnet34": ((1, 8, 8), None),
    "resnet50": ((3, 16, 16), None),
    "transformer": ((16,), VOCAB),
}


def batch(shape, vocab, rows=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    if vocab:
        return torch.randint(0, vocab, (rows, *shape), generator=g)
    return torch.randn(rows, *shape, generator=g)


def build(name, shape, vocab=None, seed=0, out=10, **params):
    return build_model(ModelSpec(name=name, params=params), shape, out, seed, vocab_size=vocab)


def test_the_registry_is_the_jobs_list_of_built_ins():
    assert tuple(registry.BUILTINS) == BUILTIN_MODELS == tuple(CASES)
    for name in BUILTIN_MODELS:
        assert ModelSpec(name=name).name == name
        assert callable(registry.builder(name))


@pytest.mark.parametrize("name", list(CASES))
def test_every_built_in_trains_a_step_on_its_input(name):
    shape, vocab = CASES[name]
    model = build(name, shape, vocab)
    model.train()
    out = model(batch(shape, vocab))
    assert out.shape == (4, 10)
    loss = nn.functional.cross_entropy(out, torch.arange(4))
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("name", list(CASES))
def test_every_built_in_is_deterministic_for_a_seed(name):
    shape, vocab = CASES[name]
    a, b, c = build(name, shape, vocab, seed=3), build(name, shape, vocab, seed=3), build(name, shape, vocab, seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa if sa[k].is_floating_point())
    x = batch(shape, vocab)
    a.eval(), b.eval()
    assert torch.equal(a(x), b(x))


@pytest.mark.parametrize(
    "shape,params",
    # LeNet-5 on 28x28 MNIST has 61,706 parameters, on 3x32x32 CIFAR 62,006: the classic shapes.
    [((1, 8, 8), None), ((1, 28, 28), 61_706), ((3, 32, 32), 62_006), ((1, 4, 4), None), ((2, 12, 20), None)],
)
def test_lenet_adapts_to_the_input(shape, params):
    model = build("lenet", shape)
    assert model(torch.zeros(2, *shape)).shape == (2, 10)
    if params is not None:
        assert sum(p.numel() for p in model.parameters()) == params


def test_lenet_learns_digits_as_images():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    xt = torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8)
    xt = (xt - xt.mean()) / xt.std()  # standardised, as smlt's model_input gives them
    yt = torch.tensor(y)
    model = build("lenet", (1, 8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(60):
        idx = torch.randint(0, len(xt), (64,), generator=g)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
    with torch.no_grad():
        assert (model(xt).argmax(1) == yt).float().mean() > 0.5  # from 0.1 by chance, in 60 steps


def test_resnets_are_torchvisions_with_a_small_input_stem():
    from smlt.runtime.train.vision import models as tv

    big = build("resnet50", (3, 224, 224))
    # torchvision's resnet50: 25,557,032 parameters with 1000 classes, so 23,528,522 with 10
    # (the head is 2048 x classes + classes); no pretrained weights.
    assert sum(p.numel() for p in big.parameters()) == 23_528_522
    assert sum(p.numel() for p in build("resnet50", (3, 224, 224), out=1000).parameters()) == 25_557_032
    assert isinstance(big, tv.ResNet) and big.conv1.kernel_size == (7, 7) and isinstance(big.maxpool, nn.MaxPool2d)
    small = build("resnet18", (3, 32, 32))
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1) and isinstance(small.maxpool, nn.Identity)
    assert build("resnet18", (3, 64, 64)).conv1.kernel_size == (3, 3)
    assert build("resnet18", (3, 65, 65)).conv1.kernel_size == (7, 7)
    assert build("resnet18", (3, 32, 32), small_input=False).conv1.kernel_size == (7, 7)
    gray = build("resnet34", (1, 96, 96))
    assert gray.conv1.in_channels == 1 and gray.conv1.kernel_size == (7, 7)
    assert gray(torch.zeros(2, 1, 96, 96)).shape == (2, 10)


def test_transformer_takes_the_manifests_vocab_size_and_params():
    model = build("transformer", (16,), VOCAB, d_model=32, heads=2, layers=1, ff=64, dropout=0.0)
    assert model.embed.num_embeddings == VOCAB and model.embed.embedding_dim == 32
    assert len(model.encoder.layers) == 1 and model.encoder.layers[0].self_attn.num_heads == 2
    assert model.encoder.layers[0].self_attn.batch_first
    assert build("transformer", (16,), VOCAB, vocab_size=80).embed.num_embeddings == 80  # the job's wins


def test_a_flat_model_is_not_given_vocab_size():
    assert isinstance(build("mlp", (16,), VOCAB), nn.Module)


@pytest.mark.parametrize(
    "name,shape,vocab,params,words",
    [
        ("resnet18", (64,), None, {}, ["resnet18", "(64,)", "channels, height, width"]),
        ("lenet", (64,), None, {}, ["lenet", "(64,)"]),
        ("lenet", (1, 3, 3), None, {}, ["lenet", "4x4", "3x3"]),
        ("transformer", (16,), None, {}, ["transformer", "vocab_size"]),
        ("transformer", (4, 4), VOCAB, {}, ["transformer", "(length,)", "(4, 4)"]),
        ("transformer", (16,), VOCAB, {"d_model": 30, "heads": 4}, ["d_model", "heads"]),
        ("resnet50", (3, 32, 32), None, {"width": 2}, ["resnet50", "'width'", "small_input, zero_init_residual"]),
        ("logreg", (4,), None, {"hidden": 3}, ["logreg", "'hidden'", "no parameters"]),
        ("lenet", (1, 8, 8), None, {"chanels": [4, 8]}, ["lenet", "'chanels'", "channels, hidden, dropout"]),
    ],
)
def test_misuse_is_an_invalid_job_naming_the_model(name, shape, vocab, params, words):
    with pytest.raises(InvalidJob) as e:
        build(name, shape, vocab, **params)
    for w in words:
        assert w in str(e.value)


def test_transformer_refuses_float_input():
    model = build("transformer", (8,), VOCAB)
    with pytest.raises(InvalidJob, match="transformer takes token ids"):
        model(torch.randn(2, 8))


def test_vision_shim_gives_working_models_and_transforms_v2():
    from smlt.runtime.train.vision import models as tv
    from smlt.runtime.train.vision import torchvision, transforms_v2

    assert torchvision.__version__.startswith("0.")
    assert tv.resnet18(weights=None, num_classes=3)(torch.zeros(2, 3, 32, 32)).shape == (2, 3)
    out = transforms_v2.RandomCrop(8, padding=1)(torch.ones(1, 8, 8))
    assert out.shape == (1, 8, 8)


def test_training_augment_field():
    assert TrainingSpec().augment == []
    assert TrainingSpec(augment=["crop", "flip"]).augment == ["crop", "flip"]
    from smlt.runtime.train.augment import AUGMENTATIONS

    (arg,) = typing.get_args(TrainingSpec.model_fields["augment"].annotation)
    assert set(typing.get_args(arg)) == set(AUGMENTATIONS)


def test_vision_shim_only_handles_the_missing_operator(monkeypatch):
    from smlt.runtime.train import vision

    real = vision.importlib.import_module

    def broken(name, *args):
        if name == "torchvision":
            raise RuntimeError("some other torchvision failure")
        return real(name, *args)

    monkeypatch.setattr(vision.importlib, "import_module", broken)
    with pytest.raises(RuntimeError, match="some other torchvision failure"):
        vision._import()
