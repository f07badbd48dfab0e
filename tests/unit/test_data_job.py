"""The job's dataset section: its options reach prepare through `local_dataset_folder`, are part
of the cache slug, and a prepared dataset that contradicts them is refused by `check_dataset`."""

from __future__ import annotations

import pytest

from smlt.datasets import local_dataset_folder
from smlt.runtime.data.prepare import read_local_manifest
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.job import DatasetSpec, check_dataset, parse_job


@pytest.fixture(autouse=True)
def home(monkeypatch, tmp_path):
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))


def csv(tmp_path):
    path = tmp_path / "d.csv"
    lines = [f"{i},{'ab'[i % 2]},{i % 3},{(i * 7) % 5}" for i in range(40)]
    path.write_text("\n".join(["a,kind,label,score", *lines]) + "\n")
    return path


def test_the_dataset_section_names_label_task_and_missing():
    job = parse_job({"dataset": {"uri": "x.csv", "label": "price", "task": "regression", "missing": "refuse"}})
    assert job.dataset.options().model_dump() == {
        "label": "price",
        "task": "regression",
        "missing": "refuse",
        "drop": [],
        "image_size": None,
        "channels": None,
        "vocab_size": None,
        "date_order": None,
        "encoding": None,
    }
    with pytest.raises(InvalidJob, match=r"dataset.missing: Input should be 'impute' or 'refuse'"):
        parse_job({"dataset": {"uri": "x.csv", "missing": "drop"}})
    with pytest.raises(InvalidJob, match=r"dataset.channels: Input should be 1 or 3"):
        parse_job({"dataset": {"uri": "pets/", "channels": 2}})


def test_a_different_label_never_reuses_a_cached_preparation(tmp_path):
    path = csv(tmp_path)
    by_label = local_dataset_folder(DatasetSpec(uri=str(path), label="label"))
    by_score = local_dataset_folder(DatasetSpec(uri=str(path), label="score", task="classification"))
    assert by_label is not None and by_score is not None and by_label != by_score
    assert read_local_manifest(by_label).label == "label" and read_local_manifest(by_score).label == "score"
    assert local_dataset_folder(DatasetSpec(uri=str(path), label="label")) == by_label  # the cache is reused
    # A plain URI is the default options: the column literally named label.
    default = local_dataset_folder(str(path))
    assert default is not None and read_local_manifest(default).label == "label"
    digits = local_dataset_folder(DatasetSpec(uri="sklearn:digits?shape=1x8x8"))
    assert digits is not None and read_local_manifest(digits).x.shape == [1, 8, 8]


def test_a_prepared_dataset_that_contradicts_the_job_is_refused(tmp_path):
    folder = local_dataset_folder(str(csv(tmp_path)))
    assert folder is not None
    manifest = read_local_manifest(folder)
    ok = parse_job({"dataset": {"uri": str(folder), "label": "label", "task": "classification"}})
    check_dataset(ok, manifest)
    with pytest.raises(InvalidJob, match=r"dataset.label: 'score', but d was prepared with label 'label'"):
        check_dataset(parse_job({"dataset": {"uri": str(folder), "label": "score"}}), manifest)
    with pytest.raises(InvalidJob, match=r"dataset.task: regression, but d was prepared for classification"):
        check_dataset(parse_job({"dataset": {"uri": str(folder), "task": "regression"}}), manifest)


def test_an_image_folder_in_a_job_is_prepared_with_its_size(tmp_path):
    from PIL import Image

    for c, colour in enumerate(("red", "blue")):
        (tmp_path / "pets" / f"c{c}").mkdir(parents=True)
        for i in range(5):
            Image.new("RGB", (10 + i, 12), colour).save(tmp_path / "pets" / f"c{c}" / f"{i}.png")
    folder = local_dataset_folder(DatasetSpec(uri="pets", image_size=8, channels=1), base=tmp_path)
    assert folder is not None and read_local_manifest(folder).x.shape == [1, 8, 8]
    (tmp_path / "pets" / "c2").mkdir()
    (tmp_path / "pets" / "c2" / "5.png").write_bytes(b"not a png")  # one unreadable image alone would be left out
    with pytest.raises(InvalidDataset, match="c2: class folder holds no readable image: all 1 is unreadable"):
        local_dataset_folder(DatasetSpec(uri="pets", image_size=8), base=tmp_path)
    assert [p.name for p in (tmp_path / "home" / "datasets").iterdir()] == [folder.name]  # nothing half-made
    (tmp_path / "plain").mkdir()
    with pytest.raises(InvalidDataset, match="not a prepared dataset .* images per class, or the parts of one table"):
        local_dataset_folder(str(tmp_path / "plain"))


def test_a_cached_preparation_tells_its_warnings_again_and_other_rules_prepare_again(tmp_path, monkeypatch, caplog):
    import logging

    import smlt.datasets

    path = tmp_path / "t.csv"
    rows = [f"{i % 7},{'x' if i % 5 else ''},{'yes' if i % 3 else 'Yes'}" for i in range(60)]
    path.write_text("\n".join(["a,b,label", *rows]) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        first = local_dataset_folder(str(path))
        told = caplog.text
        assert "differ only in letter case" in told and "preparing" in told
        caplog.clear()
        assert local_dataset_folder(str(path)) == first and caplog.text == ""  # told once a process
        monkeypatch.setattr(smlt.datasets, "_told", set())  # another process
        assert local_dataset_folder(str(path)) == first
        assert "prepared before, in" in caplog.text and "differ only in letter case" in caplog.text
        assert "preparing t.csv" not in caplog.text and "preparing " + str(path) not in caplog.text
        caplog.clear()
        monkeypatch.setattr(smlt.datasets, "preparation_rules", lambda: "an older smlt")
        again = local_dataset_folder(str(path))
    assert again != first and "preparing" in caplog.text
