"""What a built-in model needs of one sample's shape, checked when it is built so that misuse is
an InvalidJob naming the model, never a shape error in the middle of a round."""

from __future__ import annotations

from collections.abc import Sequence

from smlt.runtime.errors import InvalidJob


def image_shape(model: str, input_shape: Sequence[int]) -> tuple[int, int, int]:
    """(C, H, W) of an image sample, or InvalidJob saying what the model takes."""
    if len(input_shape) != 3:
        raise InvalidJob(
            f"model.name: {model} takes images of shape (channels, height, width); this dataset's samples "
            f"have shape {tuple(input_shape)}: prepare an NPZ of shape (N, C, H, W) or an image folder, "
            "or use mlp / logreg for tabular features"
        )
    c, h, w = (int(d) for d in input_shape)
    return c, h, w


def token_shape(model: str, input_shape: Sequence[int], vocab_size: int | None) -> tuple[int, int]:
    """(sequence length, vocab_size) of a token sample, or InvalidJob saying what the model takes."""
    if vocab_size is None:
        raise InvalidJob(
            f"model.params: {model} takes token ids and needs vocab_size; this dataset records none (its x is "
            "not token ids): prepare integer token sequences, or set model.params.vocab_size"
        )
    if len(input_shape) != 1:
        raise InvalidJob(
            f"model.name: {model} takes token sequences of shape (length,); this dataset's samples have shape "
            f"{tuple(input_shape)}"
        )
    return int(input_shape[0]), int(vocab_size)
