"""The client's pre-check measures a large model's memory with the workers' rule (tens of seconds
of CPU: not a unit test): ResNet-50 at 3x224x224, batch 256, is refused before anything starts."""

import numpy as np
import pytest

from smlt.precheck import check_model
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.errors import ModelTooLarge
from smlt.runtime.job import parse_job


def job(model, **training):
    return parse_job({"dataset": {"uri": "unused"}, "model": {"name": model}, "training": training})


def test_resnet50_at_224_px_batch_256_is_refused_saying_no_lambda_tier_holds_it(tmp_path):
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "big.npz", x=rng.integers(0, 255, (6, 3, 224, 224), dtype=np.uint8), y=np.arange(6) % 2)
    folder = tmp_path / "prepared"
    prepare_dataset(str(tmp_path / "big.npz"), str(folder), shards=1, validation_fraction=0.34)
    with pytest.raises(ModelTooLarge) as e:
        check_model(job("resnet50", batch_size=256), folder)
    text = str(e.value)
    assert "more than any Lambda memory tier can hold (the largest is 10,240 MB)" in text
    assert "lower training.batch_size to at most" in text
    need = int(text.split("needs about ")[1].split(" MB")[0].replace(",", ""))
    assert 15_000 < need < 40_000
