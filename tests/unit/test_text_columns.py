"""Free-text columns (kind "text"): a text column with more than MAX_ONEHOT_LEVELS distinct train
values whose present cells hold at least TEXT_MIN_WORDS words on average becomes a bag of hashed
words (lower-cased `\\w+` words, zlib.crc32 mod TEXT_BUCKETS, log1p of each bucket's count), by the
one rule prepare, the parts path, a pipeline's later versions, predict and the served input share."""

from __future__ import annotations

import json
import logging
import re
import zlib
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from smlt.runtime.data import fit_state, tabular
from smlt.runtime.data.manifest import Manifest
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import TableTransforms, fit_parts, prepare_dataset, prepare_parts
from smlt.runtime.data.split import Split
from smlt.runtime.data.table_fit import TableFit
from smlt.runtime.data.tables import open_table
from smlt.runtime.data.tabular import apply_columns, feature_names, read_table, text_features
from smlt.runtime.errors import InvalidDataset

GOOD = "great excellent love perfect sturdy reliable comfortable recommend".split()
BAD = "terrible awful broke poor waste flimsy useless refund".split()
FILLER = "the a this it product item was is and with for my after days use price box arrived color size".split()


def _reviews(path: Path, n: int, seed: int = 0, gaps: bool = True, header: str = "review,stars,sentiment") -> None:
    """`review,stars,sentiment` rows: 6-20 filler words with one to three words of the review's
    sentiment (and, one time in four, one of the other's); every 37th review empty when `gaps`."""
    rng = np.random.default_rng(seed)
    lines = [header]
    for i in range(n):
        good = bool(rng.random() < 0.5)
        words = list(rng.choice(FILLER, int(rng.integers(6, 21))))
        for _ in range(int(rng.integers(1, 4))):
            words[int(rng.integers(0, len(words)))] = str(rng.choice(GOOD if good else BAD))
        if rng.random() < 0.25:
            words[int(rng.integers(0, len(words)))] = str(rng.choice(BAD if good else GOOD))
        review = "" if gaps and i % 37 == 5 else '"' + " ".join(words).capitalize() + '!"'
        lines.append(f"{review},{int(rng.integers(1, 6))},{'positive' if good else 'negative'}")
    path.write_text("\n".join(lines) + "\n")


def _short(k: int) -> str:
    """A row whose review is two words (one-word with the space replaced), all different."""
    return f"w{k} x{k % 7},{k % 5 + 1},{'positive' if k % 2 else 'negative'}"


def _stored(m: Manifest, out: Path) -> np.ndarray:
    """Every stored row (train and validation shards), in a canonical order."""
    x = np.concatenate([load_file(out / s.key)["x"] for s in m.train.shards + m.validation.shards])
    return x[np.lexsort(x.T[::-1])]


def _sorted(x: np.ndarray) -> np.ndarray:
    return x[np.lexsort(x.T[::-1])]


def _reference(cell: str, buckets: int) -> np.ndarray:
    """A cell's features as plain Python computes them: `re`'s \\w+ on the lower-cased text."""
    out = np.zeros(buckets)
    for word in re.findall(r"\w+", cell.lower()):
        out[zlib.crc32(word.encode()) % buckets] += 1
    return np.log1p(out)


def test_the_rule_text_hash_or_onehot(tmp_path, caplog) -> None:
    """Many distinct values of 3+ words on average: text; of fewer words (an id, a name): hashed
    as before; few levels, however long: one-hot."""
    rng = np.random.default_rng(0)
    lines = ["review,code,city,motto,when,label"]
    for i in range(200):
        words = " ".join(rng.choice(FILLER, int(rng.integers(1, 6))))  # 3 words on average
        two = f"{rng.choice(FILLER)} {rng.choice(FILLER)}"  # 2 words, many distinct values
        motto = ["slow and steady wins", "the early bird", "carpe diem now"][i % 3]
        lines.append(f"{words},{two},c{i:04d},{motto},2024-03-{i % 28 + 1:02d},{i % 2}")
    (tmp_path / "r.csv").write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "r.csv"), str(tmp_path / "p"))
    kinds = {t.name: (t.kind, t.buckets) for t in m.columns or []}
    assert kinds == {
        "review": ("text", tabular.TEXT_BUCKETS),
        "code": ("hash", tabular.HASH_BUCKETS),
        "city": ("hash", tabular.HASH_BUCKETS),
        "motto": ("onehot", 0),
        "when": ("date", 0),
    }
    assert m.x.shape == [tabular.TEXT_BUCKETS + 2 * tabular.HASH_BUCKETS + 3 + 3]
    said = caplog.text
    assert f"r.csv: column 'review' read as free text: its words hashed into {tabular.TEXT_BUCKETS} features" in said
    assert "column 'city' has 160 distinct values" in said  # an id is still named
    assert "column 'review' has" not in said  # free text is not "nearly all different" values
    # the threshold: 3 words a present cell on average, more than MAX_ONEHOT_LEVELS values
    assert tabular.is_free_text(17, 51, 17) and not tabular.is_free_text(17, 50, 17)
    assert not tabular.is_free_text(tabular.MAX_ONEHOT_LEVELS, 1000, 16) and not tabular.is_free_text(17, 0, 0)
    # a word has a letter: dates, times, numbers and codes of digits are none (a column of date-times
    # with one stray cell is hashed as before), whatever the script
    import pyarrow as pa

    cells = ["2024-03-17 10:05:00", "2024-03-17T10:05", "+1 555-0100", "10/10 great", "naïve café 東京", None]
    assert [tabular.word_count(pa.array([c], pa.string())) for c in cells] == [0, 1, 0, 1, 3, 0]
    # an array of ASCII text takes the ASCII patterns (pyarrow compiles the Unicode ones at each
    # call): the same count as the Unicode patterns give, which one non-ASCII cell makes it take
    ascii = ["x_1 2y 12 ab_ A1b2", "2024-03-17T10:05 _ __9", "  ", "Don't stop_me now!!"]
    assert tabular.word_count(pa.array(ascii)) == 8
    assert tabular.word_count(pa.array([*ascii, "é"])) == 9
    # spaces separate words: an id, an e-mail address or a URL is one word, not text
    ids = ["3f2a1b9c-1234-4abc-8def-0123456789ab", "john.smith@example.com", "https://example.com/a/b-c"]
    assert [tabular.word_count(pa.array([c, "é"][:n])) for c in ids for n in (1, 2)] == [1, 2] * 3
    assert tabular.word_count(pa.array(["naïve\u00a0café\u3000東京"])) == 3  # no-break and ideographic spaces


def test_the_features_of_a_known_sentence() -> None:
    cells = np.array(
        [
            "Great, great product!! Not bad_at all: 10/10",
            "",
            "Café CAFÉ café... naïve résumé",
            "Straße über ÆON 東京 tower",
            "   ",
        ]
    )
    x = text_features(cells, 512)
    assert x.dtype == np.float32 and x.shape == (5, 512)
    great = zlib.crc32(b"great") % 512
    assert x[0, great] == np.float32(np.log1p(2))  # two of "great", whatever the case
    assert not x[1].any() and not x[4].any()  # no words: all zeros
    cafe = zlib.crc32("café".encode()) % 512
    assert x[2, cafe] == np.float32(np.log1p(3))
    for i, cell in enumerate(cells):  # the same words as Python's \w+ on the lower-cased text
        np.testing.assert_allclose(x[i], _reference(cell, 512), rtol=1e-6)
    np.testing.assert_array_equal(
        text_features(cells, 7), np.stack([_reference(c, 7) for c in cells]).astype(np.float32)
    )
    assert text_features(np.array([], str), 8).shape == (0, 8)
    # the ASCII rows' features are the same in an array of ASCII text (its own patterns) as in one
    # with a non-ASCII cell (the Unicode patterns)
    np.testing.assert_array_equal(text_features(cells[[0, 1, 4]], 512), x[[0, 1, 4]])


def test_stored_rows_and_predict_apply_the_same_transform(tmp_path) -> None:
    src = tmp_path / "reviews.csv"
    _reviews(src, 400)
    m = prepare_dataset(str(src), str(tmp_path / "p"))
    (review, stars) = m.columns or []
    assert (review.kind, review.buckets, review.fill, review.indicator) == ("text", tabular.TEXT_BUCKETS, "", True)
    assert feature_names(m.columns or []) == ["review"] * (tabular.TEXT_BUCKETS + 1) + ["stars"]
    stored = _stored(m, tmp_path / "p")
    x = apply_columns(m, read_table(src, {"stars"}))
    np.testing.assert_allclose(_sorted(x), stored, atol=1e-5)
    # an empty review: no words, its indicator set
    raw = tabular.encode_columns(m.columns or [], read_table(src, {"stars"}))
    assert not raw[5, : tabular.TEXT_BUCKETS].any() and raw[5, tabular.TEXT_BUCKETS] == 1
    assert raw[0, : tabular.TEXT_BUCKETS].any() and raw[0, tabular.TEXT_BUCKETS] == 0
    # new rows, no label, as `smlt predict` reads them (a review of words never seen: all zeros)
    from smlt.inference import read_table_rows

    new = tmp_path / "new.csv"
    new.write_text('review,stars\n"Terrible, flimsy: a waste!",1\nzzz qqq,5\n,3\n')
    got = apply_columns(m, read_table_rows(m, new))
    by_hand = np.zeros((3, tabular.TEXT_BUCKETS + 2), np.float32)
    by_hand[0, : tabular.TEXT_BUCKETS] = _reference("Terrible, flimsy: a waste!", tabular.TEXT_BUCKETS)
    by_hand[1, : tabular.TEXT_BUCKETS] = _reference("zzz qqq", tabular.TEXT_BUCKETS)
    by_hand[2, tabular.TEXT_BUCKETS] = 1
    by_hand[:, -1] = [1, 5, 3]
    mean, std = np.asarray(m.normalization.mean), np.asarray(m.normalization.std)
    np.testing.assert_allclose(got, (by_hand - mean) / std, rtol=1e-5, atol=1e-5)
    # refused, an empty review is named
    with pytest.raises(InvalidDataset, match=r"column 'review', line 7 is empty: missing values are refused"):
        prepare_dataset(str(src), str(tmp_path / "r"), options=SourceOptions(missing="refuse"))


def test_parts_fit_and_prepare_a_text_column_as_the_whole_file(tmp_path) -> None:
    """The words average is the whole table's: the first part alone (one-word cells) would be hashed."""
    sizes = [200, 1, 400]
    paths, lines = [], []
    for i, n in enumerate(sizes):
        p = tmp_path / f"part-{i}.csv"
        _reviews(p, n, seed=i)
        if i == 0:  # short cells here: 2 words each
            p.write_text("\n".join(["review,stars,sentiment", *(_short(k) for k in range(n))]) + "\n")
        paths.append(str(p))
        lines += p.read_text().splitlines()[1:]
    whole = tmp_path / "whole.csv"
    whole.write_text("\n".join(["review,stars,sentiment", *lines]) + "\n")
    merged, _ = fit_parts(paths)
    merged = fit_state.loads(fit_state.dumps(merged))
    table = open_table(whole)
    (block,) = list(table.blocks())
    one = TableFit(str(whole), "sentiment", ["review", "stars"], SourceOptions())
    start = 0
    for i, n in enumerate(sizes):
        val, train = Split(0.2, (0, i)).take(n)
        one.add(block.slice(start, start + n), val, train)
        start += n
    assert merged.transforms("classification") == one.transforms("classification")
    assert TableTransforms.of(merged).columns[0].kind == "text"
    first, _ = fit_parts(paths[:1])
    assert TableTransforms.of(first).columns[0].kind == "hash"
    m = prepare_parts(paths, str(tmp_path / "out"))
    x = apply_columns(m, read_table(whole, {"stars"}))
    np.testing.assert_allclose(_sorted(x), _stored(m, tmp_path / "out"), atol=1e-5)


def test_a_pipeline_version_uses_its_first_versions_text_transform(tmp_path) -> None:
    from smlt.runtime.pipeline import prepare_version

    v1 = tmp_path / "v1.csv"
    _reviews(v1, 300)
    first, _ = prepare_version(str(v1), str(tmp_path / "incoming/p/v1"), shards=2)
    assert (first.columns or [])[0].kind == "text"
    spec = json.loads((tmp_path / "incoming/p/features.json").read_text())
    assert spec["columns"][0]["kind"] == "text" and spec["columns"][0]["buckets"] == tabular.TEXT_BUCKETS
    # a later version of one-word reviews (hashed, were it a first version): still text, v1's statistics
    v2 = tmp_path / "v2.csv"
    v2.write_text("\n".join(["review,stars,sentiment", *(_short(k).replace(" ", "_") for k in range(150))]) + "\n")
    second, _ = prepare_version(str(v2), str(tmp_path / "incoming/p/v2"), shards=2)
    assert second.columns == first.columns and second.x == first.x and second.normalization == first.normalization
    x = apply_columns(second, read_table(v2, {"stars"}))
    np.testing.assert_allclose(_sorted(x), _stored(second, tmp_path / "incoming/p/v2"), atol=1e-5)


def test_the_export_of_a_table_with_a_text_column_takes_encoded_features(tmp_path) -> None:
    from smlt.exporter import SERVED_TOLERANCE, export_model
    from smlt.serving import input_kind, serving_spec
    from tests.unit.untrained import loaded, run_folder, untrained

    src = tmp_path / "reviews.csv"
    _reviews(src, 200)
    manifest = prepare_dataset(str(src), str(tmp_path / "prepared"), shards=2)
    assert input_kind(manifest) == "encoded_features"
    card, blob = untrained(manifest, "mlp", run_id="run-text")
    folder = run_folder(tmp_path / "run", card, blob)
    model = loaded(card, blob, str(folder))
    rows = model.serving_input(src)
    np.testing.assert_array_equal(rows, apply_columns(manifest, read_table(src, {"stars"})))
    done = export_model(model, "torch-export", tmp_path / "m.pt2", data=src)
    assert done.against == "smlt predict" and done.max_abs_diff <= SERVED_TOLERANCE
    spec = serving_spec(model)
    assert spec.kind == "encoded_features" and spec.input.shape[1:] == [tabular.TEXT_BUCKETS + 2]


def test_a_text_column_is_learnt_where_its_hash_was_not(tmp_path, monkeypatch) -> None:
    """Prepared shards and a plain logistic regression: the words carry the label."""
    import torch

    src = tmp_path / "reviews.csv"
    _reviews(src, 1500, seed=4)

    def accuracy(out: Path) -> float:
        m = prepare_dataset(str(src), str(out))

        def split(shards):
            parts = [load_file(out / s.key) for s in shards]
            return torch.from_numpy(np.concatenate([p["x"] for p in parts])), torch.from_numpy(
                np.concatenate([p["y"] for p in parts])
            )

        (x, y), (vx, vy) = split(m.train.shards), split(m.validation.shards)
        torch.manual_seed(0)
        net = torch.nn.Linear(x.shape[1], m.outputs)
        opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=1e-3)
        for _ in range(150):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return float((net(vx).argmax(1) == vy).float().mean())

    words = accuracy(tmp_path / "text")
    monkeypatch.setattr(tabular, "TEXT_MIN_WORDS", 10**6)  # the rule before text columns: hashed
    hashed = accuracy(tmp_path / "hash")
    print(f"validation accuracy: words {words:.3f}, the whole cell hashed {hashed:.3f}")
    assert words > 0.85 and hashed < 0.65, (words, hashed)


def test_a_long_document_costs_its_own_bytes_not_the_block_times_its_length(tmp_path) -> None:
    # a fixed-width numpy str array gives every cell the longest cell's width: one 100 KB cell in a
    # block of 20,000 rows was 8 GB; cells past WIDE_CELL characters stay Python strings
    from smlt.runtime.data.table_reader import WIDE_CELL

    words = ["good", "bad", "fine", "great", "awful", "ok"]
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(words, 30 if i != 7 else 20_000)) for i in range(400)]
    path = tmp_path / "docs.csv"
    path.write_text("doc,label\n" + "".join(f'"{d}",{i % 2}\n' for i, d in enumerate(docs)))
    (block,) = list(open_table(path).blocks())
    cells = block.column("doc", numeric=False)
    assert cells.dtype == object and max(len(c) for c in cells) > WIDE_CELL
    assert cells.tolist() == docs
    short = tmp_path / "short.csv"
    short.write_text("doc,label\n" + "".join(f'"{d}",{i % 2}\n' for i, d in enumerate(docs[:7])))
    assert next(iter(open_table(short).blocks())).column("doc", numeric=False).dtype.kind == "U"
    m = prepare_dataset(str(path), str(tmp_path / "p"))
    assert [c.kind for c in m.columns or []] == ["text"]
    features = apply_columns(m, read_table(path))
    assert features.shape == (400, m.features) and np.isfinite(features).all()
