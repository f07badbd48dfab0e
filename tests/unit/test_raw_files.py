"""Raw files as people save them (Excel, UCI, phones, notebooks), prepared through the CLI: each
either prepares to the dataset it holds or is refused naming the problem and what to do."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load

from smlt.cli import main
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import read_table


def stored(folder, split) -> np.ndarray:
    return np.concatenate([load((folder / s.key).read_bytes())["x"] for s in split.shards])


def table(n: int = 60, sep: str = ",") -> list[str]:
    rng = np.random.default_rng(0)
    return [f"{rng.random():.3f}{sep}{rng.random():.3f}{sep}{'ab'[i % 2]}" for i in range(n)]


def test_a_csv_without_a_header_is_refused_not_read_with_its_first_row_as_names(tmp_path, capsys):
    # UCI's iris.data: no header, a text label last; a sensor log of numbers only
    iris = tmp_path / "iris.csv"
    iris.write_text("5.1,3.5,1.4,0.2,Iris-setosa\n4.9,3.0,1.4,0.2,Iris-setosa\n" * 30)
    numbers = tmp_path / "log.csv"
    numbers.write_text("\n".join(r.replace("a", "0").replace("b", "1") for r in table()) + "\n")
    for src, first in ((iris, "5.1,3.5,1.4,0.2,Iris-setosa"), (numbers, "0.637,0.270,0")):
        assert main(["data", "prepare", str(src), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert (
            f"{src}: line 1, the header, holds numbers where a header names columns ({first}): the file has no header"
            in err
        )
        assert "add a header line as its first line" in err and "Traceback" not in err
        assert not (tmp_path / "out" / "manifest.json").exists()
    # Names that are numbers counting up by one are a header: pandas' default names, years.
    frame = tmp_path / "frame.csv"
    frame.write_text(",0,1,label\n" + "\n".join(f"{i},{r}" for i, r in enumerate(table())) + "\n")
    years = tmp_path / "years.csv"
    years.write_text("2019,2020,label\n" + "\n".join(table()) + "\n")
    for src in (frame, years):
        m = prepare_dataset(str(src), str(tmp_path / src.stem))
        assert m.train.rows + m.validation.rows == 60 and m.label == "label"


def test_excels_sep_line_names_the_delimiter_and_is_not_the_header(tmp_path, capsys):
    plain = tmp_path / "plain.csv"
    plain.write_text("a;b;label\n" + "\n".join(table(sep=";")) + "\n")
    hinted = tmp_path / "hinted.csv"  # as Excel reads it, with its BOM and CRLF
    hinted.write_bytes(b"\xef\xbb\xbf" + ("sep=;\r\na;b;label\r\n" + "\r\n".join(table(sep=";")) + "\r\n").encode())
    a = prepare_dataset(str(plain), str(tmp_path / "a"))
    b = prepare_dataset(str(hinted), str(tmp_path / "b"))
    assert a.columns == b.columns and a.label == b.label == "label" and b.x.shape == [2]
    np.testing.assert_array_equal(stored(tmp_path / "a", a.train), stored(tmp_path / "b", b.train))
    assert list(read_table(str(hinted)).columns) == list(read_table(str(plain)).columns) == ["a", "b", "label"]
    assert (read_table(str(hinted)).rows == read_table(str(plain)).rows + 1).all()  # the sep= line counts
    # its lines are counted: a message names the line a person sees in the file
    bad = tmp_path / "bad.csv"
    bad.write_text("sep=,\na,b,label\n1,2,x\n3,4,y\n5,,x\n")
    assert main(["data", "prepare", str(bad), "--out", str(tmp_path / "c"), "--missing", "refuse"]) == 2
    assert f"{bad}: column 'b', line 5 is empty" in capsys.readouterr().err
