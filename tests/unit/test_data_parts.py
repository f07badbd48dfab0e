"""A table in parts fitted part by part and merged (smlt.runtime.data.parts) has the statistics of
one pass over the concatenated table with the same split, up to float rounding."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import fit_parts, prepare_dataset, prepare_parts
from smlt.runtime.data.split import Split
from smlt.runtime.data.stats import Levels, Median, Moments
from smlt.runtime.data.table_fit import TableFit
from smlt.runtime.data.tables import open_table
from smlt.runtime.errors import InvalidDataset

HEADER = "size,rooms,city,price,kind"
CITIES = ["oslo", "rome", "lima", "kiev", "baku"]


def _rows(rng: np.random.Generator, n: int) -> list[str]:
    out = []
    for _ in range(n):
        size = "" if rng.random() < 0.1 else f"{rng.normal(80, 30):.3f}"
        rooms = str(int(rng.integers(1, 7)))
        city = "" if rng.random() < 0.05 else CITIES[int(rng.integers(0, 5))]
        out.append(f"{size},{rooms},{city},{rng.normal(3e5, 8e4):.2f},{'ab'[int(rng.integers(0, 2))]}")
    return out


def _parts(tmp: Path, sizes: list[int], seed: int = 7) -> tuple[list[str], Path]:
    rng = np.random.default_rng(seed)
    paths, lines = [], []
    for i, n in enumerate(sizes):
        rows = _rows(rng, n)
        path = tmp / f"part-{i:05d}.csv"
        path.write_text("\n".join([HEADER, *rows]) + "\n")
        paths.append(str(path))
        lines += rows
    whole = tmp / "whole.csv"
    whole.write_text("\n".join([HEADER, *lines]) + "\n")
    return paths, whole


def _one_pass(whole: Path, sizes: list[int], opts: SourceOptions, label: str, seed: int = 0) -> TableFit:
    """One pass over the concatenated file, each part's rows split as its part is (seed, index)."""
    table = open_table(whole)
    (block,) = list(table.blocks())  # a small file is one block
    fit = TableFit(str(whole), label, [c for c in table.columns if c != label], opts)
    start = 0
    for i, n in enumerate(sizes):
        val, train = Split(0.2, (seed, i)).take(n)
        fit.add(block.slice(start, start + n), val, train)
        start += n
    return fit


@pytest.mark.parametrize("label", ["kind", "price"])
def test_merged_parts_equal_one_pass_over_the_concatenation(tmp_path: Path, label: str) -> None:
    sizes = [300, 1, 9000, 45, 1200]  # a one-row part and one over a split block (8,192 rows)
    paths, whole = _parts(tmp_path, sizes)
    opts = SourceOptions(label=label, missing="impute")
    merged, _ = fit_parts(paths, options=opts)
    from smlt.runtime.data import fit_state

    merged = fit_state.loads(fit_state.dumps(merged))  # as the step after the Map reads it
    one = _one_pass(whole, sizes, opts, label)

    assert (merged.rows, merged.train_rows) == (one.rows, one.train_rows) == (sum(sizes), one.train_rows)
    task = "classification" if label == "kind" else "regression"
    assert merged.transforms(task) == one.transforms(task)  # kinds, levels, most frequent values, indicators
    for m, o in zip(merged.columns, one.columns):
        assert m.train_gaps == o.train_gaps
        assert m.levels.counts == o.levels.counts
        if m.numeric:
            assert m.median.value() == o.median.value()
    ml, ol = merged.labels.finish(), one.labels.finish()
    assert (ml.task, ml.classes) == (ol.task, ol.classes)
    if label == "price":
        assert ml.target is not None and ol.target is not None
        for field in ("mean", "std", "val_var"):
            np.testing.assert_allclose(getattr(ml.target, field), getattr(ol.target, field), rtol=1e-12)


def test_merged_parts_agree_with_prepare_dataset_on_the_concatenation(tmp_path: Path) -> None:
    """What does not depend on the split is what prepare_dataset finds in the concatenated CSV."""
    sizes = [500, 700, 250]
    paths, whole = _parts(tmp_path, sizes)
    opts = SourceOptions(label="kind", missing="impute")
    merged, _ = fit_parts(paths, options=opts)
    manifest = prepare_dataset(str(whole), str(tmp_path / "out"), options=opts)
    assert manifest.train.rows + manifest.validation.rows == merged.rows == sum(sizes)
    assert manifest.classes == merged.labels.finish().classes
    assert manifest.columns is not None
    mine = merged.transforms("classification")
    assert [(t.name, t.kind, t.levels, t.indicator) for t in manifest.columns] == [
        (t.name, t.kind, t.levels, t.indicator) for t in mine
    ]


def test_a_column_of_text_in_one_part_is_text_in_every_part(tmp_path: Path) -> None:
    paths, _ = _parts(tmp_path, [50, 50, 50])
    third = Path(paths[2])
    third.write_text(third.read_text().replace("\n", "\nnear,3,oslo,1.0,a\n", 1))  # 'size' text in part 2
    merged, _ = fit_parts(paths, options=SourceOptions(label="kind", missing="impute"))
    size = merged.columns[0]
    assert not size.numeric and "near" in size.levels.counts
    assert sum(size.levels.counts.values()) + size.train_gaps == merged.train_rows  # every part counted as text


def test_the_first_bad_number_is_named_in_the_parts_order(tmp_path: Path) -> None:
    paths, _ = _parts(tmp_path, [40, 40, 40])
    for i, line in ((1, 30), (2, 3)):  # part 1 line 30 ('size'), part 2 line 3 ('rooms')
        path = Path(paths[i])
        lines = path.read_text().splitlines()
        cells = lines[line - 1].split(",")
        cells[0 if i == 1 else 1] = "inf"
        lines[line - 1] = ",".join(cells)
        path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidDataset, match=r"part-00001\.csv: column 'size', line 30"):
        fit_parts(paths, options=SourceOptions(label="kind", missing="impute"))


def test_a_bad_cell_names_its_part_and_line(tmp_path: Path) -> None:
    paths, _ = _parts(tmp_path, [40, 40])
    path = Path(paths[1])
    lines = path.read_text().splitlines()
    lines[6] = lines[6].rsplit(",", 2)[0] + ",many," + lines[6].rsplit(",", 1)[1]  # a price that is text
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidDataset, match=r"part-00001\.csv: column 'price', line 7: 'many' is not a number"):
        fit_parts(paths, options=SourceOptions(label="price", task="regression"))
    # a row without a label is left out, named by its part and line (tests/unit/test_unlabelled_rows.py)
    lines[6] = lines[6].rsplit(",", 1)[0] + ","
    path.write_text("\n".join(lines) + "\n")
    merged, rows = fit_parts(paths, options=SourceOptions(label="kind"))
    assert merged.rows == 79 and merged.labels.first_unlabelled == [(paths[1], "line", 7)]


def test_moments_median_and_levels_merge_as_one() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(5, 2, (1000, 3)), rng.normal(-1, 9, (77, 3))
    a[3, 1] = np.nan
    left, right, both = Moments(3), Moments(3), Moments(3)
    left.add(a), right.add(b), both.add(np.concatenate([a, b]))
    left.merge(right)
    for field in ("n", "mean", "std", "low", "high"):
        np.testing.assert_allclose(getattr(left, field), getattr(both, field), rtol=1e-12)
    for keep in (10_000, 100):  # kept exactly, and by the bins' second pass
        m1, m2 = Median(keep), Median(keep)
        m1.add(a[:, 0]), m2.add(b[:, 0])
        m1.merge(m2)
        if m1.needs_second_pass:
            m1.start_second_pass()
            m1.again(a[:, 0]), m1.again(b[:, 0])
        expected = float(np.median(np.concatenate([a[:, 0], b[:, 0]])))
        assert math.isclose(m1.value(), expected, rel_tol=0 if keep == 10_000 else 2**-20)
    import pyarrow as pa

    x, y = Levels(), Levels()
    x.add(pa.array(["a", "b", None, "a"])), y.add(pa.array(["c", "a"]))
    x.merge(y)
    assert x.counts == {"a": 3, "b": 1, "c": 1}


def test_a_table_in_parts_prepares_into_standardised_shards_named_by_part(tmp_path: Path) -> None:
    sizes = [300, 9000, 45, 1200]
    paths, _ = _parts(tmp_path, sizes)
    out = tmp_path / "out"
    manifest = prepare_parts(paths, str(out), options=SourceOptions(label="price", missing="impute"))
    assert manifest.train.rows + manifest.validation.rows == sum(sizes)
    assert {s.key.split("-")[1] for s in manifest.train.shards} == {f"{i:05d}" for i in range(len(sizes))}
    assert (out / "manifest.json").exists() and not list(out.glob(".smlt-*"))
    xs = [load_file(out / s.key)["x"] for s in manifest.train.shards]
    assert sum(map(len, xs)) == manifest.train.rows == sum(s.rows for s in manifest.train.shards)
    x = np.concatenate(xs).astype(np.float64)
    # standardised with the train split's moments over every part: mean 0, std 1 (imputed cells included)
    np.testing.assert_allclose(x.mean(axis=0), 0.0, atol=1e-5)
    varying = x.std(axis=0) > 0
    np.testing.assert_allclose(x.std(axis=0)[varying], 1.0, rtol=1e-4)
    again = prepare_parts(paths, str(tmp_path / "again"), options=SourceOptions(label="price", missing="impute"))
    assert [s.sha256 for s in again.train.shards] == [s.sha256 for s in manifest.train.shards]  # seeded


def test_medians_past_memory_settle_in_a_second_pass_over_the_parts(tmp_path: Path, monkeypatch) -> None:
    """Each child's second pass on its own copy of the merged first pass (stored as a child reads
    it, smlt.runtime.data.fit_state), merged after (`Median.merge_again`), gives the median of the
    train split over every part."""
    import csv

    from smlt.runtime.data import fit_state, table_fit
    from smlt.runtime.data.parts import merge_moments
    from smlt.runtime.data.prepare import TableTransforms, part_moments

    monkeypatch.setattr(table_fit, "MEDIAN_NUMBERS", 0)  # keep 4,096 numbers: past that, two passes
    sizes = [3000, 9000, 2000]
    paths, _ = _parts(tmp_path, sizes)
    opts = SourceOptions(label="kind", missing="impute")
    fit, _ = fit_parts(paths, options=opts)
    t = TableTransforms.of(fit)
    assert t.medians[0].median.needs_second_pass
    stored = fit_state.dumps((fit, t))
    children = []
    for i, p in enumerate(paths):  # a child: its own copy of what the reduce wrote, its answer stored
        mine_fit, mine = fit_state.loads(stored)
        moments = part_moments(p, i, mine_fit, mine, options=opts)
        children.append(fit_state.loads(fit_state.dumps((moments, [c.median for c in mine.medians]))))
    for _, medians in children:
        for whole, part in zip(t.medians, medians):
            whole.median.merge_again(part)
    norm, _ = t.settle(merge_moments([m for m, _ in children]), (fit.train_rows, fit.rows - fit.train_rows), None)

    train_sizes = []
    for i, p in enumerate(paths):
        with open(p) as f:
            rows = list(csv.DictReader(f))
        _, train = Split(0.2, (0, i)).take(len(rows))
        train_sizes += [float(rows[j]["size"]) for j in train if rows[j]["size"]]
    expected = float(np.median(train_sizes))
    assert math.isclose(t.columns[0].fill, expected, rel_tol=2**-20)
    serial = prepare_parts(paths, str(tmp_path / "out"), options=opts)
    assert serial.columns is not None and serial.columns[0].fill == t.columns[0].fill
    np.testing.assert_allclose(serial.normalization.mean, norm.mean, rtol=1e-12)
    np.testing.assert_allclose(serial.normalization.std, norm.std, rtol=1e-12)


def test_parquet_parts_prepare_as_the_same_table_in_csv_parts(tmp_path: Path) -> None:
    import pyarrow.csv as pv
    import pyarrow.parquet as pq

    paths, _ = _parts(tmp_path, [400, 300])
    parquet = []
    for p in paths:
        table = pv.read_csv(
            p, convert_options=pv.ConvertOptions(column_types=dict.fromkeys(HEADER.split(","), "string"))
        )
        pq.write_table(table, out := p.replace(".csv", ".parquet"))
        parquet.append(out)
    opts = SourceOptions(label="kind", missing="impute")
    from_csv = prepare_parts(paths, str(tmp_path / "csv"), options=opts)
    from_parquet = prepare_parts(parquet, str(tmp_path / "pq"), options=opts)
    assert from_parquet.columns == from_csv.columns and from_parquet.classes == from_csv.classes
    assert (from_parquet.train.rows, from_parquet.validation.rows) == (from_csv.train.rows, from_csv.validation.rows)
    np.testing.assert_allclose(from_parquet.normalization.mean, from_csv.normalization.mean, rtol=1e-9)


def _spark_folder(tmp: Path, sizes: list[int]) -> tuple[Path, list[str]]:
    """Parts as Spark writes them: `_SUCCESS`, a `.crc` beside each part, a `_temporary/` folder."""
    folder = tmp / "spark_out"
    folder.mkdir()
    paths, _ = _parts(folder, sizes)
    (folder / "whole.csv").unlink()
    (folder / "_SUCCESS").write_bytes(b"")
    for p in paths:
        (folder / f".{Path(p).name}.crc").write_bytes(b"crc\x00")
    (folder / "_temporary" / "0").mkdir(parents=True)
    return folder, paths


def test_a_folder_of_parts_prepares_as_the_pipeline_prepares_its_parts(tmp_path: Path) -> None:
    """`smlt data prepare DIR` on a folder of parts is prepare_parts on them: the same manifest (its
    name and source the folder's) and the same shards, byte for byte; the options apply."""
    folder, paths = _spark_folder(tmp_path, [700, 300, 1200])
    opts = SourceOptions(label="price", task="regression", drop=["rooms"], missing="impute")
    reference = prepare_parts(paths, str(tmp_path / "ref"), options=opts, seed=3)
    manifest = prepare_dataset(str(folder), str(tmp_path / "out"), options=opts, seed=3)
    assert manifest.name == "spark_out" and manifest.source == str(folder)
    assert manifest.columns is not None and "rooms" not in {c.name for c in manifest.columns}
    skip = {"name", "source"}
    assert manifest.model_dump(exclude=skip) == reference.model_dump(exclude=skip)
    for shard in manifest.train.shards + manifest.validation.shards:
        assert (tmp_path / "out" / shard.key).read_bytes() == (tmp_path / "ref" / shard.key).read_bytes()
    with pytest.raises(InvalidDataset, match="holds an earlier dataset"):
        prepare_dataset(str(folder), str(tmp_path / "out"), options=opts, seed=3)
    again = prepare_dataset(str(folder), str(tmp_path / "out"), options=opts, seed=3, replace=True)
    assert again == manifest and {p.name for p in (tmp_path / "out").iterdir()} == {
        "manifest.json",
        *(s.key for s in manifest.train.shards + manifest.validation.shards),
    }


def test_a_folder_of_parts_with_another_header_is_refused_by_the_part(tmp_path: Path) -> None:
    folder, paths = _spark_folder(tmp_path, [50, 60, 70])
    last = Path(paths[2])
    last.write_text(last.read_text().replace(HEADER, HEADER.replace("rooms", "bedrooms"), 1))
    with pytest.raises(
        InvalidDataset, match=r"spark_out/part-00002\.csv has no column 'rooms': the parts of one table"
    ):
        prepare_dataset(str(folder), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # refused before anything is read or written


@pytest.mark.parametrize(
    "files, found",
    [
        ({"_SUCCESS": ""}, "it holds nothing"),
        ({"part-00000.csv": "a,b\n1,2\n"}, r"one table file, a source on its own \(give .*part-00000\.csv\)"),
        ({"a.csv": "a,b\n1,2\n", "b.parquet": "x"}, r"table files of 2 formats \(csv, parquet\)"),
        ({"a.csv": "a,b\n1,2\n", "b.csv.gz": "x", "notes.txt": "x"}, r"table files of 2 formats \(csv, txt\)"),
        ({"a.csv": "a,b\n1,2\n", "b.csv": "a,b\n1,2\n", "notes.md": "x"}, r"beside its table files, notes\.md"),
    ],
)
def test_a_folder_of_nothing_usable_says_what_a_folder_may_be(tmp_path: Path, files: dict, found: str) -> None:
    folder = tmp_path / "raw"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    may = "one subfolder of .* images per class, or the parts of one table"
    with pytest.raises(InvalidDataset, match=f"raw: a folder is a source when it holds {may}.*{found}"):
        prepare_dataset(str(folder), str(tmp_path / "out"))


def test_a_folder_with_class_subfolders_stays_an_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    for c in ("cat", "dog"):
        (tmp_path / "pets" / c).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (6, 6), (40 * i, 0, 0)).save(tmp_path / "pets" / c / f"{i}.png")
    (tmp_path / "pets" / "a.csv").write_text("a,b\n1,2\n")
    (tmp_path / "pets" / "b.csv").write_text("a,b\n1,2\n")
    m = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "out"), shards=1)
    assert m.classes == ["cat", "dog"] and m.x.shape == [3, 6, 6]


def test_a_jobs_folder_of_parts_is_cached_by_its_parts(tmp_path: Path, monkeypatch) -> None:
    """A job's `dataset.uri` naming a folder of parts is prepared into the cache, keyed by each
    part's name and content (as one file is by its content): a part changed or added prepares
    again; a new `_SUCCESS` or `.crc` does not."""
    from smlt.datasets import local_dataset_folder
    from smlt.runtime.data.prepare import read_local_manifest
    from smlt.runtime.job import DatasetSpec

    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))
    folder, paths = _spark_folder(tmp_path, [200, 300])
    spec = DatasetSpec(uri="spark_out", label="kind")
    first = local_dataset_folder(spec, base=tmp_path)
    assert first is not None and first.name.startswith("spark_out-")
    assert read_local_manifest(first).train.rows + read_local_manifest(first).validation.rows == 500
    (folder / "_SUCCESS").write_text("again")
    (folder / f".{Path(paths[0]).name}.crc").write_bytes(b"other")
    assert local_dataset_folder(spec, base=tmp_path) == first
    part = Path(paths[1])
    part.write_text(part.read_text().replace(",a\n", ",b\n", 1))  # one label changed, same size
    changed = local_dataset_folder(spec, base=tmp_path)
    assert changed is not None and changed != first
    extra = folder / "part-00002.csv"
    extra.write_text(Path(paths[0]).read_text())
    added = local_dataset_folder(spec, base=tmp_path)
    assert added is not None and added not in (first, changed)
    assert read_local_manifest(added).train.rows + read_local_manifest(added).validation.rows == 700
    with pytest.raises(InvalidDataset, match="spark_out/part-00002.csv has no column 'size'"):
        extra.write_text("area,rooms,city,price,kind\n1,2,oslo,3,a\n")
        local_dataset_folder(spec, base=tmp_path)


def test_a_folder_of_parts_in_another_encoding_reads_every_part_in_it(tmp_path: Path) -> None:
    folder, paths = _spark_folder(tmp_path, [80, 90])
    for p in paths:
        text = Path(p).read_text().replace("oslo", "malmö")
        Path(p).write_bytes(text.encode("cp1252"))
    opts = SourceOptions(label="kind", encoding="cp1252")
    reference = prepare_parts(paths, str(tmp_path / "ref"), options=opts)
    manifest = prepare_dataset(str(folder), str(tmp_path / "out"), options=opts)
    assert manifest.model_dump(exclude={"name", "source"}) == reference.model_dump(exclude={"name", "source"})
    assert manifest.columns is not None and "malmö" in str(manifest.columns)
    with pytest.raises(InvalidDataset, match=r"spark_out/part-00000\.csv"):
        prepare_dataset(str(folder), str(tmp_path / "plain"), options=SourceOptions(label="kind"))


def test_a_folder_of_two_parts_gets_the_shards_one_file_of_it_gets(tmp_path: Path) -> None:
    """`--shards` is the table's, whatever its parts: a 2-part folder with --shards 16 has at least
    16 train shards (8 validation), each part its share by its rows (ceil(16 x its rows / the
    table's), at least one), the rows conserved, the same shards again; so 16 workers each take
    a shard of their own (the planner's round-robin), where one shard a part left 8 of them
    training on another's rows."""
    from smlt.runtime.data.spool import part_share
    from smlt.runtime.steps.plan import assign_shards

    folder, paths = _spark_folder(tmp_path, [1500, 600])
    opts = SourceOptions(label="kind", missing="impute")
    m = prepare_dataset(str(folder), str(tmp_path / "out"), options=opts, shards=16)
    assert len(m.train.shards) >= 16 and len(m.validation.shards) >= 8
    for split, wanted in ((m.train, 16), (m.validation, 8)):
        by_part: dict[str, list[int]] = {}
        for s in split.shards:
            by_part.setdefault(s.key.split("-")[1], []).append(s.rows)
        part_rows = {k: sum(v) for k, v in by_part.items()}
        assert sum(part_rows.values()) == split.rows  # every row in one shard
        for part, rows in by_part.items():
            assert len(rows) == part_share(wanted, part_rows[part], split.rows)
            assert max(rows) - min(rows) <= 1  # dealt in turn within the part
        files = [load_file(tmp_path / "out" / s.key) for s in split.shards]
        assert [len(f["y"]) for f in files] == [s.rows for s in split.shards]
    assert m.train.rows + m.validation.rows == 2100
    held = [s for w in assign_shards(len(m.train.shards), 16, []) for s in w]
    assert sorted(held) == list(range(len(m.train.shards)))  # each shard held by one worker, none shared
    assert [w for w in assign_shards(2, 16, []) if w == [0]] == [[0]] * 8  # one shard a part: 8 workers on it
    again = prepare_dataset(str(folder), str(tmp_path / "again"), options=opts, shards=16)
    assert again.model_dump(exclude={"source"}) == m.model_dump(exclude={"source"})  # the same shards, by sha256
    reference = prepare_parts(paths, str(tmp_path / "ref"), options=opts)  # prepare_parts' default: 16 too
    assert [s.sha256 for s in reference.train.shards] == [s.sha256 for s in m.train.shards]


@pytest.mark.parametrize(
    "shards, train, validation", [(1, [1, 1], [1, 1]), (3, [2, 1], [1, 1]), (40, [27, 14], [14, 7])]
)
def test_each_part_takes_its_share_of_the_shards(tmp_path: Path, shards: int, train: list, validation: list) -> None:
    """--shards 1 keeps one train and one validation shard a part (the layout before the shares);
    a part's share rounds up, so the parts have --shards at least between them."""
    paths, _ = _parts(tmp_path, [1000, 500])
    m = prepare_parts(paths, str(tmp_path / "out"), options=SourceOptions(label="kind"), shards=shards)

    def counts(split) -> list[int]:
        return [sum(s.key.split("-")[1] == f"{i:05d}" for s in split.shards) for i in range(2)]

    assert counts(m.train) == train and counts(m.validation) == validation
    assert sum(train) >= shards and sum(validation) >= max(1, shards // 2)


def test_a_part_past_64_mb_a_shard_gets_more_than_its_share(tmp_path: Path, monkeypatch) -> None:
    """The 64 MB rule still holds within a part: whichever gives more shards."""
    from smlt.runtime.data import spool

    monkeypatch.setattr(spool, "MAX_SHARD_BYTES", 4_000)  # a shard of this table: about 160 rows
    paths, _ = _parts(tmp_path, [2000, 200])
    m = prepare_parts(paths, str(tmp_path / "out"), options=SourceOptions(label="kind"), shards=2)
    assert all(s.bytes < 8_000 for s in m.train.shards + m.validation.shards)
    assert len([s for s in m.train.shards if s.key.startswith("train-00000-")]) > 2


def test_replace_keeps_the_earlier_dataset_when_a_folder_of_parts_is_refused(tmp_path: Path) -> None:
    """As for one file: --replace removes the earlier dataset only once the parts' statistics are
    through (a refused folder leaves it whole), before the first new shard is written."""
    folder, paths = _spark_folder(tmp_path, [300, 200])
    out = tmp_path / "out"
    opts = SourceOptions(label="price", task="regression")
    earlier = prepare_dataset(str(folder), str(out), options=opts)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    bad = Path(paths[1])
    lines = bad.read_text().splitlines()
    lines[4] = lines[4].rsplit(",", 2)[0] + ",many," + lines[4].rsplit(",", 1)[1]
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidDataset, match=r"part-00001\.csv: column 'price', line 5"):
        prepare_dataset(str(folder), str(out), options=opts, replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier dataset, whole
    assert read_manifest(out) == earlier
    bad.write_text("\n".join(lines[:4] + lines[5:]) + "\n")
    now = prepare_dataset(str(folder), str(out), options=opts, replace=True, shards=4)
    assert {p.name for p in out.iterdir()} == {
        "manifest.json",
        *(s.key for s in now.train.shards + now.validation.shards),
    }


def test_replace_keeps_the_earlier_dataset_when_the_shards_pass_refuses_a_part(tmp_path: Path) -> None:
    """A part refused only in the shards pass (its standardised values overflow float32: the
    statistics and moments passes take it) leaves the earlier dataset whole: the parts' shards are
    staged until every part is through, then the earlier dataset is removed and they move in. It
    used to be removed first, and the folder kept part 0's new shards and no manifest."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    for folder, b in (
        (good, lambda part, i: 1.0 + i % 3),
        (bad, lambda part, i: 3e38 if part == 0 or i % 50 else -3e38),
    ):
        folder.mkdir()
        for part in range(2):
            rows = [f"{i / 100:.2f},{b(part, i):.6g},{i % 2}" for i in range(200)]
            (folder / f"part-{part}.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    out = tmp_path / "out"
    opts = SourceOptions(label="label")
    earlier = prepare_dataset(str(good), str(out), options=opts)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(InvalidDataset, match=r"part-1\.csv \(train split, standardised\): .* column 'b'"):
        prepare_dataset(str(bad), str(out), options=opts, replace=True)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier dataset, whole; nothing staged left
    assert read_manifest(out) == earlier
    now = prepare_dataset(str(good), str(out), options=opts, replace=True, seed=1)
    assert {p.name for p in out.iterdir()} == {
        "manifest.json",
        *(s.key for s in now.train.shards + now.validation.shards),
    }
    assert read_manifest(out) == now != earlier


def read_manifest(folder: Path):  # noqa: ANN201
    from smlt.runtime.data.prepare import read_local_manifest

    return read_local_manifest(folder)
