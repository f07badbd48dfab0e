"""Image augmentation (training.augment): per-sample random crop with padding and horizontal flip,
bit-identical for a seed, leaving the global RNG alone, images only."""

import pytest
import torch

from smlt.runtime.errors import InvalidJob
from smlt.runtime.train.augment import build_augment, crop_padding


def images(rows=16, shape=(3, 32, 32)):
    """Distinct, non-zero pixels: a zero in the output is padding."""
    return 1 + torch.arange(rows * torch.Size(shape).numel(), dtype=torch.float32).reshape(rows, *shape)


def test_nothing_to_do_is_no_transform():
    assert build_augment([], (3, 32, 32), 0) is None
    assert build_augment([], (64,), 0) is None


@pytest.mark.parametrize("shape", [(64,), (16,), (4, 4)])
def test_only_images_are_augmented(shape):
    with pytest.raises(InvalidJob, match="training.augment: crop augment images") as e:
        build_augment(["crop"], shape, 0)
    assert str(shape) in str(e.value)


def test_unknown_names_are_refused():
    with pytest.raises(InvalidJob, match="unknown augmentation 'rotate'"):
        build_augment(["flip", "rotate"], (3, 32, 32), 0)


def test_crop_padding_is_an_eighth_of_the_side():
    assert (
        crop_padding(32, 32) == 4 and crop_padding(8, 8) == 1 and crop_padding(64, 48) == 6 and crop_padding(4, 4) == 1
    )


def test_same_seed_same_batches_and_the_global_rng_is_untouched():
    x = images()
    a, b = (
        build_augment(["crop", "flip"], (3, 32, 32), (7, 1, 2)),
        build_augment(["crop", "flip"], (3, 32, 32), (7, 1, 2)),
    )
    other = build_augment(["crop", "flip"], (3, 32, 32), (7, 1, 3))
    assert a is not None and b is not None and other is not None
    torch.manual_seed(5)
    untouched = torch.rand(3)
    torch.manual_seed(5)
    first = [a(x) for _ in range(3)]
    assert torch.equal(torch.rand(3), untouched)  # the augmentation drew nothing from the global RNG
    torch.manual_seed(6)  # and does not depend on it
    again = [b(x) for _ in range(3)]
    assert all(torch.equal(p, q) for p, q in zip(first, again))
    assert not torch.equal(first[0], first[1])  # the stream moves on from batch to batch
    assert not torch.equal(other(x), first[0])


def test_each_sample_gets_its_own_crop_kept_in_size():
    x = images(32)
    out = build_augment(["crop"], (3, 32, 32), 0)(x)
    assert out.shape == x.shape and out.dtype == x.dtype
    padding = {tuple((o == 0).flatten().tolist()) for o in out}  # where each sample's crop was shifted
    assert len(padding) > 8


def test_flip_mirrors_some_samples_and_leaves_the_others():
    x = images(32, (1, 8, 8))
    out = build_augment(["flip"], (1, 8, 8), 1)(x)
    flipped = [torch.equal(o, i.flip(-1)) for o, i in zip(out, x)]
    kept = [torch.equal(o, i) for o, i in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept)) and any(flipped) and any(kept)


def test_importing_the_augmentations_does_not_import_torchvision():
    import subprocess
    import sys

    code = "import sys, smlt.runtime.train.augment, smlt.runtime.train.models; print('torchvision' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # seconds of a tabular worker's cold start
