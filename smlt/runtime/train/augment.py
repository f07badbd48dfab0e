"""Training-data augmentation for images (`training.augment`), from torchvision's transforms v2.

`build_augment(names, input_shape, seed)` gives `transform(batch) -> batch` for the worker's
training loop (after `model_input`, so padding fills with the normalised mean, 0). Each sample of
a batch gets its own crop and flip. The random draws come from the augmentation's own generator
state, seeded by the caller (job seed, round, worker): a retried worker augments bit-identically,
and the global RNG (dropout) is left as it would be without augmentation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from smlt.runtime.errors import InvalidJob

Transform = Callable[[torch.Tensor], torch.Tensor]


def crop_padding(height: int, width: int) -> int:
    """Padding of the random crop: 4 px for 32 px images (the CIFAR recipe), 1/8 of the side in general."""
    return max(1, min(height, width) // 8)


def _crop(height: int, width: int) -> Transform:
    from smlt.runtime.train.vision import transforms_v2  # (torchvision takes seconds to import: only when used)

    return transforms_v2.RandomCrop((height, width), padding=crop_padding(height, width))


def _flip(height: int, width: int) -> Transform:
    from smlt.runtime.train.vision import transforms_v2

    return transforms_v2.RandomHorizontalFlip()


# training.augment's names (the job's Literal lists the same) -> the transform for (height, width).
AUGMENTATIONS: dict[str, Callable[[int, int], Transform]] = {"crop": _crop, "flip": _flip}


class SeededTransform:
    """A per-sample transform run on its own RNG state, so its draws depend only on the seed."""

    def __init__(self, transform: Transform, seed: int | Sequence[int]):
        self.transform = transform
        mixed = int(np.random.SeedSequence(seed).generate_state(1, np.uint64)[0])
        self.state = torch.Generator().manual_seed(mixed).get_state()

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(self.state)
            out = torch.stack([self.transform(sample) for sample in batch])
            self.state = torch.get_rng_state()
        return out


def build_augment(names: Sequence[str], input_shape: Sequence[int], seed: int | Sequence[int]) -> Transform | None:
    """The batch transform for `training.augment` (None when it is empty)."""
    if not names:
        return None
    if len(input_shape) != 3:
        raise InvalidJob(
            f"training.augment: {', '.join(names)} augment images of shape (channels, height, width); this "
            f"dataset's samples have shape {tuple(input_shape)}: leave training.augment empty"
        )
    _, h, w = input_shape
    unknown = [n for n in names if n not in AUGMENTATIONS]
    if unknown:
        raise InvalidJob(f"training.augment: unknown augmentation {unknown[0]!r}: use {', '.join(AUGMENTATIONS)}")
    from smlt.runtime.train.vision import transforms_v2

    steps = [AUGMENTATIONS[n](h, w) for n in dict.fromkeys(names)]  # in the job's order, each once
    return SeededTransform(transforms_v2.Compose(steps), seed)
