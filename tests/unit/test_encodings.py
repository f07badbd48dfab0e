"""Text tables in the encodings spreadsheets write: a UTF-8 or UTF-16 file with its byte-order
mark (Excel's "CSV UTF-8" and "Unicode Text", the latter tab-separated and named .txt) is read as
it is, a file in another encoding (Excel's "CSV (Comma delimited)" on Windows: cp1252) with
`--encoding` / `dataset.encoding` only: each prepares to the shards of its UTF-8 twin and predicts
as it does; without the encoding such a file is refused by its line, character and cell, never guessed."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from smlt.cli import main
from smlt.datasets import local_dataset_folder
from smlt.runtime.data import table_reader
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
from smlt.runtime.data.tabular import read_table
from smlt.runtime.errors import InvalidDataset, InvalidJob
from smlt.runtime.job import DatasetSpec, parse_job
from tests.unit.untrained import run_folder, untrained

CITIES = ["Zürich", "Genève", "Köln", "Malmö", "Oslo"]


def _text(rows: int = 600, sep: str = ",") -> str:
    """A table as Excel writes it on Windows (CRLF), its city cells not ASCII."""
    rng = np.random.default_rng(0)
    lines = [sep.join(["city", "size", "label"])] + [
        sep.join([CITIES[i % len(CITIES)], f"{rng.normal():.4f}", str(int(rng.integers(0, 2)))]) for i in range(rows)
    ]
    return "\r\n".join(lines) + "\r\n"


@pytest.fixture
def small(monkeypatch):
    """Many blocks, and transcoded chunks that end inside a character (an odd number of bytes)."""
    monkeypatch.setattr(table_reader, "BLOCK_BYTES", 2048)
    monkeypatch.setattr(table_reader, "_TEXT_CHUNK", 1001)


def _shards(path: Path, out: Path, encoding: str | None = None) -> list[str]:
    m = prepare_dataset(str(path), str(out), shards=2, options=SourceOptions(encoding=encoding))
    assert m.name == path.name.split(".")[0]
    return [s.sha256 for s in m.train.shards + m.validation.shards]


FORMS = {
    "utf8_bom.csv": lambda: b"\xef\xbb\xbf" + _text().encode(),
    "unicode.txt": lambda: b"\xff\xfe" + _text(sep="\t").encode("utf-16-le"),  # Excel's "Unicode Text"
    "unicode_be.txt": lambda: b"\xfe\xff" + _text(sep="\t").encode("utf-16-be"),
    "unicode32.tsv": lambda: _text(sep="\t").encode("utf-32"),  # its BOM, then little-endian
    "unicode.txt.gz": lambda: gzip.compress(b"\xff\xfe" + _text(sep="\t").encode("utf-16-le")),
}


@pytest.mark.parametrize("name", sorted(FORMS))
def test_a_file_with_a_byte_order_mark_prepares_to_the_shards_of_its_utf8_twin(tmp_path, small, name):
    (tmp_path / "d.csv").write_bytes(_text().encode())
    (tmp_path / name).write_bytes(FORMS[name]())
    want = _shards(tmp_path / "d.csv", tmp_path / "a")
    assert _shards(tmp_path / name, tmp_path / "b") == want
    # a BOM says the encoding, whatever is named
    assert _shards(tmp_path / name, tmp_path / "c", encoding="cp1252") == want
    assert read_table(tmp_path / name).columns["city"][:5].tolist() == CITIES


def test_a_windows_1252_file_prepares_with_its_encoding_named(tmp_path, small):
    (tmp_path / "d.csv").write_bytes(_text().encode())
    (tmp_path / "latin1.csv").write_bytes(_text().encode("cp1252"))
    (tmp_path / "latin1.txt").write_bytes(_text(sep=";").encode("cp1252"))  # "Text" export, semicolons
    want = _shards(tmp_path / "d.csv", tmp_path / "a")
    assert _shards(tmp_path / "latin1.csv", tmp_path / "b", encoding="cp1252") == want
    assert _shards(tmp_path / "latin1.txt", tmp_path / "c", encoding="windows-1252") == want
    assert read_table(tmp_path / "latin1.csv", encoding="cp1252").columns["city"][:5].tolist() == CITIES


def test_a_file_not_utf8_without_its_encoding_is_refused_by_line_character_and_cell(tmp_path, small):
    path = tmp_path / "latin1.csv"
    path.write_bytes(_text().encode("cp1252"))
    with pytest.raises(InvalidDataset) as e:
        prepare_dataset(str(path), str(tmp_path / "out"))
    assert str(e.value) == (
        f"{path}: line 2, character 2 (column 'city'): byte 0xFC is not UTF-8 text; read as Windows-1252 (what "
        "Excel's \"CSV (Comma delimited)\" writes on Windows) the cell is 'Zürich': if that is right, read the "
        'file with --encoding cp1252 (a job\'s "dataset": {"encoding": "cp1252"}), or save it as CSV UTF-8'
    )
    assert not (tmp_path / "out").exists()

    # far past the first block, in a quoted cell; the header's own
    lines = _text().encode().split(b"\r\n")
    lines[400] = b'"Gen\xe8ve, GE",0.5,1'
    path.write_bytes(b"\r\n".join(lines))
    with pytest.raises(InvalidDataset, match=r"line 401, character 5 \(column 'city'\): byte 0xE8 .* 'Genève, GE'"):
        read_table(path)
    path.write_bytes("Größe,city,label\n1,a,0\n".encode("cp1252"))
    with pytest.raises(InvalidDataset, match=r"line 1, character 3 \(the header\): byte 0xF6 .* the name is 'Größe'"):
        read_table(path)


def test_nothing_is_guessed_when_the_bytes_are_not_windows_1252_nor_the_encoding_named(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(_text(20).encode("cp1252").replace(b"K\xf6ln", b"K\x81ln"))  # 0x81: no cp1252 character
    with pytest.raises(InvalidDataset) as e:
        read_table(path)
    assert str(e.value) == (
        f"{path}: line 2, character 2 (column 'city'): byte 0xFC is not UTF-8 text: name the file's encoding with "
        '--encoding NAME (a job\'s "dataset": {"encoding": "NAME"}), or save it as CSV UTF-8'
    )
    with pytest.raises(InvalidDataset) as e:
        read_table(path, encoding="cp1252")
    assert str(e.value) == (
        f"{path}: line 4, character 2: byte 0x81 is not cp1252 text (character maps to <undefined>), the encoding "
        'named: name the file\'s own with --encoding NAME (a job\'s "dataset": {"encoding": "NAME"}), or save it '
        "as CSV UTF-8"
    )
    cut = tmp_path / "cut.txt"
    cut.write_bytes((b"\xff\xfe" + _text(20, "\t").encode("utf-16-le"))[:-1])
    with pytest.raises(InvalidDataset, match=r"cut.txt: line 21, character \d+: byte 0x0A is not UTF-16 text "):
        read_table(cut)


def test_the_encoding_is_checked_by_name_and_kept_as_codecs_name_it(tmp_path):
    job = parse_job({"dataset": {"uri": "x.csv", "encoding": "Windows-1252"}})
    assert job.dataset.encoding == "cp1252"
    with pytest.raises(InvalidJob, match=r"dataset.encoding: unknown encoding 'latin-9000': name one Python's"):
        parse_job({"dataset": {"uri": "x.csv", "encoding": "latin-9000"}})
    with pytest.raises(InvalidJob, match=r"dataset.encoding: 'base64' is not a text encoding"):
        parse_job({"dataset": {"uri": "x.csv", "encoding": "base64"}})
    with pytest.raises(InvalidDataset, match=r"encoding: unknown encoding 'nope'"):
        read_table(tmp_path / "x.csv", encoding="nope")


def test_a_job_reads_its_source_with_its_encoding_and_caches_by_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SMLT_HOME", str(tmp_path / "home"))
    path = tmp_path / "latin1.csv"
    path.write_bytes(_text(60).encode("cp1252"))
    with pytest.raises(InvalidDataset, match=r"--encoding cp1252"):
        local_dataset_folder(DatasetSpec(uri=str(path)))
    a = local_dataset_folder(DatasetSpec(uri=str(path), encoding="cp1252"))
    b = local_dataset_folder(DatasetSpec(uri=str(path), encoding="latin-1"))  # another reading: another folder
    assert a is not None and b is not None and a != b
    assert local_dataset_folder(DatasetSpec(uri=str(path), encoding="windows-1252")) == a  # one name, one folder
    assert "Zürich" in (read_local_manifest(a).columns or [])[0].levels


def test_predict_and_prepare_take_encoding_on_the_command_line(tmp_path, capsys):
    (tmp_path / "d.csv").write_bytes(_text(200).encode())
    m = prepare_dataset(str(tmp_path / "d.csv"), str(tmp_path / "p"), shards=2)
    card, blob = untrained(m, "mlp", tmp_path / "p")
    run = run_folder(tmp_path / "run", card, blob)
    (tmp_path / "latin1.csv").write_bytes(_text(200).encode("cp1252"))
    (tmp_path / "unicode.txt").write_bytes(b"\xff\xfe" + _text(200, "\t").encode("utf-16-le"))

    assert main(["predict", str(run), str(tmp_path / "d.csv"), "--out", str(tmp_path / "a.csv")]) == 0
    assert main(["predict", str(run), str(tmp_path / "unicode.txt"), "--out", str(tmp_path / "b.csv")]) == 0
    args = ["predict", str(run), str(tmp_path / "latin1.csv"), "--out", str(tmp_path / "c.csv")]
    assert main(args) == 2
    assert "line 2, character 2 (column 'city'): byte 0xFC is not UTF-8" in capsys.readouterr().err
    assert main([*args, "--encoding", "cp1252"]) == 0
    want = (tmp_path / "a.csv").read_bytes()
    assert (tmp_path / "b.csv").read_bytes() == want and (tmp_path / "c.csv").read_bytes() == want

    out = tmp_path / "prepared"
    assert main(["data", "prepare", str(tmp_path / "latin1.csv"), "--out", str(out), "--encoding", "cp1252"]) == 0
    assert read_local_manifest(out).train.rows == m.train.rows
    with pytest.raises(SystemExit):
        main(["data", "prepare", str(tmp_path / "latin1.csv"), "--out", str(out), "--encoding", "nope"])
    assert "argument --encoding: unknown encoding 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["data", "prepare", "--help"])
    assert "--encoding NAME" in capsys.readouterr().out


def test_an_upload_of_txt_parts_is_one_table_and_notes_beside_a_csv_are_another_source():
    from smlt.runtime.steps.prepare import find_source
    from smlt.runtime.steps.prepare_limits import MixedUpload
    from smlt.runtime.steps.upload_parts import table_parts

    parts = table_parts({"part-0.txt": 10, "part-1.txt": 12, "_SUCCESS": 0}, "s3://b/v1/")
    assert parts is not None and parts.names == ("part-0.txt", "part-1.txt")
    assert find_source({"sales.txt": 10}, "s3://b/v1/").root == "sales.txt"
    assert table_parts({"data.csv": 10, "notes.txt": 5}, "s3://b/v1/") is None  # not parts of one table
    with pytest.raises(MixedUpload, match=r"s3://b/v1/ holds 2 data sources \(data.csv, notes.txt\)"):
        find_source({"data.csv": 10, "notes.txt": 5}, "s3://b/v1/")


def _jsonl(rows: int = 600) -> str:
    """`_text`'s table as JSON Lines."""
    head, *lines = _text(rows).split("\r\n")[:-1]
    return "".join(f'{{"city": "{c}", "size": {s}, "label": {y}}}\n' for c, s, y in (line.split(",") for line in lines))


JSONL_FORMS = {
    "utf8_bom.jsonl": lambda: b"\xef\xbb\xbf" + _jsonl().encode(),
    "utf16.jsonl": lambda: _jsonl().encode("utf-16"),  # its BOM, then little-endian
    "utf16_be.ndjson": lambda: b"\xfe\xff" + _jsonl().encode("utf-16-be"),
    "utf16.jsonl.gz": lambda: gzip.compress(_jsonl().encode("utf-16")),
}


@pytest.mark.parametrize("name", sorted(JSONL_FORMS))
def test_json_lines_with_a_byte_order_mark_prepare_as_a_csv_does_to_the_shards_of_the_utf8_twin(tmp_path, small, name):
    (tmp_path / "d.csv").write_bytes(_text().encode())
    (tmp_path / name).write_bytes(JSONL_FORMS[name]())
    want = _shards(tmp_path / "d.csv", tmp_path / "a")
    assert _shards(tmp_path / name, tmp_path / "b") == want
    assert _shards(tmp_path / name, tmp_path / "c", encoding="cp1252") == want  # the BOM decides
    assert read_table(tmp_path / name).columns["city"][:5].tolist() == CITIES


def test_json_lines_in_windows_1252_are_refused_by_line_character_and_key_and_read_with_the_encoding(tmp_path, small):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(_jsonl().encode("cp1252"))
    with pytest.raises(InvalidDataset) as e:
        prepare_dataset(str(path), str(tmp_path / "out"))
    assert str(e.value) == (
        f"{path}: line 1, character 12 (key 'city'): byte 0xFC is not UTF-8 text; read as Windows-1252 (what "
        "programs on Windows write) the value is 'Zürich': if that is right, read the file with --encoding cp1252 "
        '(a job\'s "dataset": {"encoding": "cp1252"}), or save it as UTF-8 JSON Lines'
    )
    assert not (tmp_path / "out").exists()
    (tmp_path / "d.csv").write_bytes(_text().encode())
    assert _shards(path, tmp_path / "b", encoding="cp1252") == _shards(tmp_path / "d.csv", tmp_path / "a")

    # far past the first block (pyarrow's reader takes the block: the line-by-line read names it)
    lines = _jsonl().encode().split(b"\n")
    lines[400] = b'{"city": "Gen\xe8ve", "size": 0.5, "label": 1}'
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(InvalidDataset, match=r"line 401, character 14 \(key 'city'\): byte 0xE8 .* 'Genève'"):
        read_table(path)
    path.write_bytes(b'{"Gr\xf6\xdfe": 1, "label": 0}\n')
    with pytest.raises(InvalidDataset, match=r"line 1, character 5 \(a key\): byte 0xF6 .* the value is 'Größe'"):
        read_table(path)


@pytest.mark.parametrize("order", ["le", "be"])
@pytest.mark.parametrize("name", ["d.csv", "d.jsonl"])
def test_utf16_without_its_byte_order_mark_is_named_never_guessed(tmp_path, capsys, name, order):
    """ASCII text in UTF-16 without a mark is every other byte NUL: named, and read with the encoding named."""
    text = _text() if name.endswith(".csv") else _jsonl()
    path = tmp_path / name
    path.write_bytes(text.encode(f"utf-16-{order}"))
    with pytest.raises(InvalidDataset) as e:
        read_table(path)
    upper = order.upper()
    first = " ".join(f"{b:02X}" for b in text[:4].encode(f"utf-16-{order}"))
    assert str(e.value) == (
        f"{path}: every other byte of its start is NUL ({first} ...): it looks like UTF-16 {upper} text without a "
        f"byte-order mark (its first line would read {text.splitlines()[0][:40]!r}); nothing is guessed: read it "
        f'with --encoding utf-16-{order} (a job\'s "dataset": {{"encoding": "utf-16-{order}"}}), or save it as '
        + ("CSV UTF-8" if name.endswith(".csv") else "UTF-8 JSON Lines")
    )
    (tmp_path / "d8.csv").write_bytes(_text().encode())
    want = _shards(tmp_path / "d8.csv", tmp_path / "a")
    assert _shards(path, tmp_path / "b", encoding=f"utf-16-{order}") == want
    assert main(["data", "prepare", str(path), "--out", str(tmp_path / "c")]) != 0
    assert "looks like UTF-16" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_a_nul_byte_names_a_binary_file_and_its_line(tmp_path, small):
    path = tmp_path / "d.csv"
    path.write_bytes(b"PK\x03\x04\x14\x00\x06\x00" + bytes(range(256)))  # an .xlsx renamed .csv
    with pytest.raises(InvalidDataset) as e:
        read_table(path)
    assert str(e.value) == (
        f"{path}: line 1, character 6: byte 0x00 (NUL): the file is not text, its first bytes say it is a zip "
        "archive (an Excel workbook .xlsx is one: name it .xlsx)"
    )
    # one NUL far past the first block, in a CSV and in JSON Lines
    for name, text in (("d.csv", _text()), ("d.jsonl", _jsonl())):
        path = tmp_path / name
        lines = text.encode().split(b"\n")
        lines[400] = lines[400][:3] + b"\x00" + lines[400][3:]
        path.write_bytes(b"\n".join(lines))
        with pytest.raises(InvalidDataset) as e:
            read_table(path)
        assert str(e.value) == (
            f"{path}: line 401, character 4: byte 0x00 (NUL), which no text table holds: the file is binary, or text "
            "in an encoding with NUL bytes (UTF-16, UTF-32) and no byte-order mark: name that encoding with "
            f"--encoding NAME, or save it as {'CSV UTF-8' if name.endswith('.csv') else 'UTF-8 JSON Lines'}"
        )
