"""A model with seeded, untrained weights on a prepared dataset, as a run writes it and as
`smlt.load_model` gives it back: for the tests of predict, export and serving, which check how
data reaches a model, not what training makes of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save

from smlt.inference import LoadedModel, _Found, build
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.job import parse_job
from smlt.runtime.modelcard import ModelCard, build_card, card_json, read_card, with_card
from smlt.runtime.train.models import build_model


def untrained(
    manifest: Manifest,
    model: str = "mlp",
    prepared: Path | None = None,
    run_id: str = "r1",
    edit: Callable[[torch.nn.Module], None] | None = None,
) -> tuple[ModelCard, bytes]:
    """`model`'s card and file (seed 0's weights, then `edit`ed) on `manifest` (`prepared`: its
    folder, whose manifest.json the card digests)."""
    job = parse_job({"dataset": {"uri": "s3://b/p/"}, "model": {"name": model}})
    raw = (prepared / "manifest.json").read_bytes() if prepared is not None else None
    card = build_card(run_id, job, manifest, raw, None)
    net = build_model(card.model, card.input_shape, card.output_dim, 0, vocab_size=card.vocab_size)
    if edit is not None:
        with torch.no_grad():
            edit(net)
    return card, with_card(save(net.state_dict()), card)


def loaded(card: ModelCard, blob: bytes, where: str = "m") -> LoadedModel:
    """The model as `smlt.load_model` gives it."""
    return LoadedModel(build(card, _Found(blob, None, None, where), None), card, where)


def run_folder(folder: Path, card: ModelCard, blob: bytes, with_json: bool = True) -> Path:
    """The model in a run's output folder (model.safetensors, and model.json `with_json`)."""
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(blob)
    if with_json:
        (folder / "model.json").write_bytes(card_json(card))
    return folder


def load_folder(folder: Path) -> LoadedModel:
    """A run folder's model, its card read from the file."""
    blob = (folder / "model.safetensors").read_bytes()
    card = read_card(blob, "m")
    assert card is not None
    return loaded(card, blob)
