import hashlib

import numpy as np
import pytest
from safetensors.numpy import load

from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
from smlt.runtime.errors import InvalidDataset


def test_digits_sharded_with_manifest(tmp_path):
    m = prepare_dataset("sklearn:digits", str(tmp_path), shards=8, validation_fraction=0.2)
    assert m.train.rows + m.validation.rows == 1797
    assert m.features == 64 and m.outputs == 10 and m.task == "classification"
    assert len(m.train.shards) == 8 and sum(s.rows for s in m.train.shards) == m.train.rows
    assert read_local_manifest(tmp_path) == m
    blob = (tmp_path / m.train.shards[0].key).read_bytes()
    assert hashlib.sha256(blob).hexdigest() == m.train.shards[0].sha256
    arrays = load(blob)
    assert arrays["x"].dtype == np.float32 and arrays["y"].dtype == np.int64
    # Normalised with train statistics: train features have ~zero mean.
    xs = np.concatenate([load((tmp_path / s.key).read_bytes())["x"] for s in m.train.shards])
    assert abs(float(xs.mean())) < 0.05


def test_csv_and_npz(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(100, 3)).astype(np.float32)
    y = (x[:, 0] > 0).astype(int)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    m = prepare_dataset(str(tmp_path / "d.npz"), str(tmp_path / "npz"), shards=4)
    assert m.features == 3 and m.outputs == 2
    csv = tmp_path / "d.csv"
    csv.write_text("a,b,c,label\n" + "\n".join(f"{a},{b},{c},{lab}" for (a, b, c), lab in zip(x, y)))
    m2 = prepare_dataset(str(csv), str(tmp_path / "csv"), shards=4)
    assert m2.features == 3 and m2.train.rows == m.train.rows


@pytest.mark.parametrize(
    "source, msg",
    [
        ("sklearn:nope", "unknown scikit-learn dataset"),
        ("/does/not/exist.csv", "not found"),
    ],
)
def test_bad_sources(tmp_path, source, msg):
    with pytest.raises(InvalidDataset, match=msg):
        prepare_dataset(source, str(tmp_path))


def test_npz_without_arrays(tmp_path):
    np.savez(tmp_path / "bad.npz", a=np.zeros(3))
    with pytest.raises(InvalidDataset, match="needs arrays 'x' and 'y'"):
        prepare_dataset(str(tmp_path / "bad.npz"), str(tmp_path / "out"))
