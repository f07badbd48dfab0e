"""Raw files as people save them (Excel, UCI, phones, notebooks), prepared through the CLI: each
either prepares to the dataset it holds or is refused naming the problem and what to do."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load

from smlt.cli import main
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset, read_local_manifest
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


def _png(path, seed: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(path)


def test_images_in_subfolders_of_a_class_folder_are_its_class(tmp_path, caplog):
    import logging

    nested, flat = tmp_path / "nested", tmp_path / "flat"
    for i in range(6):  # cat/ holds its breeds' folders, and a few images of its own
        for sub in ("persian/", "siamese/", ""):
            _png(nested / "cat" / f"{sub}{i}.png", hash((sub, i)) % 1000)
            _png(flat / "cat" / f"{sub.strip('/')}{i}.png", hash((sub, i)) % 1000)
        _png(nested / "dog" / f"{i}.png", 1000 + i)
        _png(flat / "dog" / f"{i}.png", 1000 + i)
    # what Windows, macOS and Jupyter leave beside the images: passed over without a word
    (nested / "cat" / "Thumbs.db").write_bytes(b"\xd0\xcf\x11\xe0")
    (nested / "dog" / "desktop.ini").write_text("[.ShellClassInfo]\n")
    _png(nested / "cat" / ".ipynb_checkpoints" / "0-checkpoint.png", 0)
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(nested), str(tmp_path / "a"))
    assert m.classes == ["cat", "dog"] and m.train.rows + m.validation.rows == 24
    counts = [a + b for a, b in zip(m.train.class_counts or [], m.validation.class_counts or [])]
    assert counts == [18, 6]
    assert (
        "nested: 12 images in subfolders of class folders are read as the class folder's class "
        "(cat/persian/ 6, cat/siamese/ 6), as torchvision's ImageFolder reads them" in caplog.text
    )
    assert "skipped" not in caplog.text and "Thumbs.db" not in caplog.text
    f = prepare_dataset(str(flat), str(tmp_path / "b"))
    a, b = (
        np.concatenate([stored(tmp_path / d, s.train), stored(tmp_path / d, s.validation)])
        for d, s in (("a", m), ("b", f))
    )
    assert a.shape == b.shape == (24, 3, 12, 12)  # the same images, in another order
    np.testing.assert_array_equal(np.sort(a.reshape(len(a), -1), axis=0), np.sort(b.reshape(len(b), -1), axis=0))


def test_a_folder_wrapping_the_image_folder_names_it(tmp_path, capsys):
    for c in ("cat", "dog"):
        _png(tmp_path / "download" / "pets" / c / "0.png", 0)
    assert main(["data", "prepare", str(tmp_path / "download"), "--out", str(tmp_path / "out")]) == 2
    assert (
        "an image folder needs at least 2 class subfolders, found ['pets']: pets/ holds the class folders "
        f"(cat/, dog/), so prepare {tmp_path / 'download' / 'pets'}" in capsys.readouterr().err
    )


def test_ids_written_without_spaces_are_hashed_and_named_not_read_as_free_text(tmp_path, caplog):
    import logging
    import uuid

    rng = np.random.default_rng(0)
    lines = ["order,email,page,review,label"]
    for i in range(80):
        order = uuid.UUID(int=int(rng.integers(0, 2**63)) << 64 | i)
        page = f"https://shop.example.com/products/item-{i}?ref=mail"
        review = f"{['great', 'poor'][i % 2]} product number {i} would buy again"
        lines.append(f"{order},user{i}.name@example.com,{page},{review},{'ab'[i % 2]}")
    src = tmp_path / "orders.csv"
    src.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(tmp_path / "out"))
    assert {c.name: c.kind for c in m.columns or []} == {
        "order": "hash",
        "email": "hash",
        "page": "hash",
        "review": "text",
    }
    for name in ("order", "email", "page"):  # named as ids, which a model can only memorise
        assert f"column '{name}' has 64 distinct values in 64 train rows, hashed into 32 features" in caplog.text
    assert "column 'review' read as free text" in caplog.text and "column 'order' read as free text" not in caplog.text


def test_ucis_question_mark_is_an_empty_cell_in_a_column_of_numbers(tmp_path, caplog):
    import logging

    # breast-cancer-wisconsin.data, with a header: 'bare_nuclei' is '?' where it was not measured
    rng = np.random.default_rng(1)
    lines = ["id,clump,bare_nuclei,workclass,class"]
    for i in range(100):
        nuclei = "?" if i % 25 == 3 else str(rng.integers(1, 11))
        lines.append(
            f"{1000 + i * 7},{rng.integers(1, 11)},{nuclei},{['Private', '?', 'State-gov'][i % 3]},{2 + 2 * (i % 2)}"
        )
    src = tmp_path / "wisconsin.csv"
    src.write_text("\n".join(lines) + "\n")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(tmp_path / "out"))
    kinds = {c.name: c for c in m.columns or []}
    assert kinds["bare_nuclei"].kind == "numeric" and kinds["bare_nuclei"].indicator
    assert "column 'bare_nuclei': 4 cells written '?' are read as empty" in caplog.text
    assert kinds["workclass"].kind == "onehot" and "?" in kinds["workclass"].levels  # text: a level like any other
    assert m.classes == ["2", "4"]


def test_an_accountants_negative_in_parentheses_is_a_negative_number(tmp_path):
    # Excel's accounting and currency formats, saved as CSV as shown: `(1,234.50)`, `$ (5.00)`
    amounts = ["1,234.50", "(1,234.50)", "$ (5.00)", "($7)", "(12)", "$3.00", "(0.5%)", "8"] * 8
    comma = tmp_path / "ledger.csv"
    comma.write_text("amount,label\n" + "\n".join(f'"{a}",{"ab"[i % 2]}' for i, a in enumerate(amounts)) + "\n")
    euro = tmp_path / "konten.csv"  # a comma-decimal locale's: `(1.234,50)`
    euro.write_text(
        "amount;label\n"
        + "\n".join(
            f"{a.replace(',', '_').replace('.', ',').replace('_', '.')};{'ab'[i % 2]}" for i, a in enumerate(amounts)
        )
        + "\n"
    )
    want = [1234.5, -1234.5, -5.0, -7.0, -12.0, 3.0, -0.5, 8.0] * 8
    for src in (comma, euro):
        t = read_table(str(src), ["amount"])
        np.testing.assert_array_equal(t.columns["amount"].astype(float), want)
        m = prepare_dataset(str(src), str(tmp_path / src.stem))
        assert [c.kind for c in m.columns or []] == ["numeric"]
    # unbalanced or with a sign inside, it is not a number
    odd = tmp_path / "odd.csv"
    odd.write_text("amount,label\n" + "".join(f"{a},a\n" for a in ["(5", "5)", "(-5)", "()"] + ["1"] * 60))
    assert read_table(str(odd), []).columns["amount"][:4].tolist() == ["(5", "5)", "(-5)", "()"]


def test_a_column_empty_in_every_row_is_left_out_and_said(tmp_path, caplog, capsys):
    import logging

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(2)
    n = 80
    x, labels = np.round(rng.random(n), 4), [str(v) for v in rng.choice(["a", "b"], n)]
    # a spreadsheet's column with a header and nothing below it; a Parquet column of nulls (of no
    # type, or of strings: pandas' object column of None)
    csv = tmp_path / "sheet.csv"
    csv.write_text("x,notes,label\n" + "\n".join(f"{v:.4f},,{lab}" for v, lab in zip(x, labels)) + "\n")
    parquet = tmp_path / "frame.parquet"
    pq.write_table(
        pa.table({"x": x, "notes": pa.nulls(n), "comment": pa.nulls(n, pa.string()), "label": labels}), parquet
    )
    plain = tmp_path / "plain.csv"
    plain.write_text("x,label\n" + "\n".join(f"{v:.4f},{lab}" for v, lab in zip(x, labels)) + "\n")
    p = prepare_dataset(str(plain), str(tmp_path / "p"))
    for src, said in ((csv, "column 'notes' is"), (parquet, "columns 'notes', 'comment' are")):
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            m = prepare_dataset(str(src), str(tmp_path / src.stem))
        assert [c.name for c in m.columns or []] == ["x"] and m.x.shape == [1]
        assert f"{src}: {said} empty in every row of the train split: left out" in caplog.text
        np.testing.assert_allclose(stored(tmp_path / src.stem, m.train), stored(tmp_path / "p", p.train), rtol=1e-6)
    # with no other feature column, refused by name
    only = tmp_path / "only.csv"
    only.write_text("notes,label\n" + "\n".join(f",{lab}" for lab in labels) + "\n")
    assert main(["data", "prepare", str(only), "--out", str(tmp_path / "o")]) == 2
    assert f"{only}: every feature column is empty in the train split's rows" in capsys.readouterr().err


def test_a_title_or_comment_above_the_header_is_refused_naming_the_line(tmp_path, capsys):
    import openpyxl

    body = "a,b,label\n" + "\n".join(table()) + "\n"
    cases = {
        # a spreadsheet's report saved as CSV: a title in A1, a blank row, then the table
        "report.csv": (
            "Sales report 2024,,\n,,\n" + body,
            "line 1 is not a header: 'Sales report 2024' and 2 empty cells",
        ),
        "titled.csv": (
            "Sales report 2024\n" + body,
            "line 1 is not a header: one cell, 'Sales report 2024', where line 2 holds 3",
        ),
        "sensor.csv": (
            "# generated by sensor v2\n# units: mm\n" + body,
            "line 1 is not a header: one cell, '# generated by sensor v2'",
        ),
        "blank.csv": (",,\n" + body, "line 1 is not a header: empty cells"),
    }
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["data", "prepare", str(tmp_path / name), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"{tmp_path / name}: {said}" in err and "delete the lines above the column names" in err, err
    book = openpyxl.Workbook()
    book.active["A1"] = "Sales report 2024"
    book.active.append([])
    for line in body.splitlines():
        book.active.append(line.split(","))
    book.save(tmp_path / "report.xlsx")
    assert main(["data", "prepare", str(tmp_path / "report.xlsx"), "--out", str(tmp_path / "out")]) == 2
    assert (
        f"{tmp_path / 'report.xlsx'}: row 1 of sheet 'Sheet' is not a header: one cell, 'Sales report 2024', "
        "where the rows below hold 3 columns" in capsys.readouterr().err
    )
    # a one-column file in a comma-decimal locale stays one (its next line's `0,5` is one cell)
    one = tmp_path / "one.csv"
    one.write_text("price\n" + "\n".join(f"{i},5" for i in range(40)) + "\n")
    assert list(read_table(str(one)).columns) == ["price"]


def test_lines_ended_by_a_cr_alone_read_as_the_same_file_with_newlines(tmp_path, capsys):
    # Excel for Mac's "CSV (Macintosh)"
    text = "a,b,label\n" + "\n".join(table()) + "\n"
    unix, mac = tmp_path / "unix.csv", tmp_path / "mac.csv"
    unix.write_text(text)
    mac.write_bytes(text.replace("\n", "\r").encode())
    a = prepare_dataset(str(unix), str(tmp_path / "a"))
    b = prepare_dataset(str(mac), str(tmp_path / "b"))
    assert a.columns == b.columns and a.train.rows == b.train.rows == 48
    np.testing.assert_array_equal(stored(tmp_path / "a", a.train), stored(tmp_path / "b", b.train))
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"a,b,label\r1,2,x\r3,,y\r")
    assert main(["data", "prepare", str(bad), "--out", str(tmp_path / "c"), "--missing", "refuse"]) == 2
    assert f"{bad}: column 'b', line 3 is empty" in capsys.readouterr().err


def test_formats_smlt_does_not_read_say_what_to_save_them_as(tmp_path, capsys):
    import json

    records = [{"a": i / 10, "label": "ab"[i % 2]} for i in range(40)]
    files = {
        "records.json": (
            json.dumps(records, indent=2),
            "one JSON array, which smlt does not read: write one JSON object per line as JSON Lines (.jsonl",
        ),
        "events.json": (
            "\n".join(json.dumps(r) for r in records) + "\n",
            "JSON Lines (one JSON object per line) under a .json name: name it .jsonl",
        ),
        "config.json": (json.dumps({"rows": records}), "a JSON document, which smlt does not read"),
        "old.xls": ("\xd0\xcf\x11\xe0", "an Excel 97-2003 workbook, which smlt does not read: save it as .xlsx"),
        "frame.pkl": ("\x80\x04", "a pickle, which smlt never loads (it runs code): write the frame as Parquet"),
    }
    for name, (text, said) in files.items():
        (tmp_path / name).write_text(text)
        assert main(["data", "prepare", str(tmp_path / name), "--out", str(tmp_path / "out")]) == 2
        assert f"{tmp_path / name}: {said}" in capsys.readouterr().err
    # renamed as it says, the JSON Lines file prepares
    (tmp_path / "events.json").rename(tmp_path / "events.jsonl")
    assert prepare_dataset(str(tmp_path / "events.jsonl"), str(tmp_path / "ok")).train.rows == 32


def test_a_pipeline_version_without_a_class_is_said(tmp_path, caplog):
    import logging

    rng = np.random.default_rng(3)

    def version(name: str, classes: str) -> str:
        src = tmp_path / f"{name}.csv"
        src.write_text(
            "size,label\n" + "\n".join(f"{rng.random():.3f},{rng.choice(list(classes))}" for _ in range(80)) + "\n"
        )
        return str(src)

    folder = tmp_path / "incoming" / "houses"
    assert main(["data", "prepare", version("v1", "xyz"), "--out", str(folder / "v1")]) == 0
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        assert main(["data", "prepare", version("v2", "xy"), "--out", str(folder / "v2")]) == 0
    assert (
        "v2.csv: class 'z' has no row in this dataset, of the 3 classes its features fix (x, y, z): a model trained "
        "on it never learns it" in caplog.text
    )
    m = read_local_manifest(str(folder / "v2"))
    assert m.classes == ["x", "y", "z"] and m.generation == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="smlt.notice"):  # every class there: nothing said
        assert main(["data", "prepare", version("v3", "xyz"), "--out", str(folder / "v3")]) == 0
    assert "no row in this dataset" not in caplog.text


def test_a_label_or_drop_named_without_the_headers_spaces_is_refused_naming_the_column(tmp_path, capsys):
    src = tmp_path / "sheet.csv"  # a spreadsheet's header cells typed with spaces
    src.write_text("a , b ,  Price \n" + "\n".join(f"{i / 7:.3f},{i % 5},{i * 3.5}" for i in range(60)) + "\n")
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "o"), "--label", "price"]) == 2
    assert (
        f"{src}: no label column 'price' (did you mean '  Price '? name it exactly, spaces and case as the header "
        "has them); the columns are 'a ', ' b ', '  Price '" in capsys.readouterr().err
    )
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "o"), "--label", "  Price ", "--drop", "b"]) == 2
    assert "drop: no column 'b' (did you mean ' b '?)" in capsys.readouterr().err
    m = prepare_dataset(str(src), str(tmp_path / "ok"))  # the last column, as the header names it
    assert m.label == "  Price " and m.task == "regression"


def test_a_name_twice_in_the_header_says_where(tmp_path, capsys):
    src = tmp_path / "twice.csv"
    src.write_text("x,y,x,label\n" + "\n".join(f"{i},{i % 3},{i * 2},{'ab'[i % 2]}" for i in range(40)) + "\n")
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "o")]) == 2
    assert (
        f"{src}: column 'x' appears twice in the header (columns 1 and 3, counting from 1): rename one of them"
        in capsys.readouterr().err
    )


def test_jfif_and_avif_images_are_read_and_heic_photos_are_named(tmp_path, caplog, capsys):
    import logging

    from PIL import Image

    rng = np.random.default_rng(4)
    for c in ("cat", "dog"):
        (tmp_path / "pets" / c).mkdir(parents=True)
        for i, (suffix, kind) in enumerate(
            [(".jfif", "JPEG"), (".avif", "AVIF"), (".JPG", "JPEG"), (".jpe", "JPEG")] * 2
        ):
            Image.fromarray(rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(
                tmp_path / "pets" / c / f"{i}{suffix}", kind
            )
        (tmp_path / "pets" / c / "IMG_0001.HEIC").write_bytes(b"\x00\x00\x00\x18ftypheic")
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(tmp_path / "pets"), str(tmp_path / "out"))
    assert m.train.rows + m.validation.rows == 16 and m.x.shape == [3, 16, 16]
    assert (
        "skipped 2 files that are not images" in caplog.text and "HEIC photos (an iPhone's) are not read" in caplog.text
    )
    # a class of HEIC photos only: refused saying how to convert them
    for f in (tmp_path / "pets" / "dog").iterdir():
        if f.suffix != ".HEIC":
            f.unlink()
    assert main(["data", "prepare", str(tmp_path / "pets"), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "dog: class folder holds no PNG, JPEG, GIF, WebP, AVIF, BMP or TIFF image; HEIC photos" in err
    assert "convert them to JPEG" in err


def test_thousands_grouped_by_no_break_spaces_or_apostrophes_are_numbers(tmp_path):
    rng = np.random.default_rng(5)
    values = np.round(rng.uniform(1000, 999_999, 60), 2)
    rates = np.round(rng.uniform(0, 30, 60), 1)
    labels = ["ab"[i % 2] for i in range(60)]

    def grouped(v: float, group: str, point: str) -> str:
        return f"{v:,.2f}".replace(",", "_").replace(".", point).replace("_", group)

    nbsp, nnbsp, apostrophe = "\u00a0", "\u202f", "'"
    rows = list(zip(values, rates, labels))
    files = {  # as Excel in France (a no-break space, a narrow one) and Switzerland write them
        "fr.csv": "montant;taux;label\n"
        + "".join(f"{grouped(v, nbsp, ',')};{r:.1f}{nbsp}%;{lab}\n".replace(".", ",") for v, r, lab in rows),
        "fr2.csv": "montant;taux;label\n"
        + "".join(f"{grouped(v, nnbsp, ',')} €;{r:.1f} %;{lab}\n".replace(".", ",") for v, r, lab in rows),
        "ch.csv": "amount,rate,label\n" + "".join(f"{grouped(v, apostrophe, '.')},{r}%,{lab}\n" for v, r, lab in rows),
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        t = read_table(str(tmp_path / name))
        first, second = list(t.columns)[:2]
        np.testing.assert_allclose(t.columns[first].astype(float), values, err_msg=name)
        np.testing.assert_allclose(t.columns[second].astype(float), rates, err_msg=name)
        m = prepare_dataset(str(tmp_path / name), str(tmp_path / name.replace(".", "_")))
        assert [c.kind for c in m.columns or []] == ["numeric", "numeric"], name
    # in a comma-decimal file a plain space groups too; `1.234` stays 1.234 there
    (tmp_path / "sp.csv").write_text("x;label\n1 234,5;a\n1.234;b\n12 345 678;a\n")
    assert read_table(str(tmp_path / "sp.csv")).columns["x"].astype(float).tolist() == [1234.5, 1.234, 12345678.0]


def test_parquet_half_floats_and_64_bit_ids_are_numbers(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from smlt.inference import read_inputs

    rng = np.random.default_rng(6)
    n = 80
    half = rng.random(n).astype(np.float16)  # numpy's float16, as pandas writes it
    ids = rng.integers(2**60, 2**62, n, dtype=np.int64)  # a snowflake id, past float64's 2^53
    labels = ["ab"[i % 2] for i in range(n)]
    src = tmp_path / "events.parquet"
    pq.write_table(pa.table({"h": half, "id": ids, "uid": ids.astype(np.uint64), "label": labels}), src)
    m = prepare_dataset(str(src), str(tmp_path / "out"))
    assert [(c.name, c.kind) for c in m.columns or []] == [("h", "numeric"), ("id", "numeric"), ("uid", "numeric")]
    # the same numbers as a CSV of them: float32 half floats, ids as their nearest float64
    csv = tmp_path / "events.csv"
    csv.write_text("h,id,uid,label\n" + "".join(f"{float(a)!r},{b},{b},{c}\n" for a, b, c in zip(half, ids, labels)))
    c = prepare_dataset(str(csv), str(tmp_path / "csv"))
    np.testing.assert_allclose(stored(tmp_path / "out", m.train), stored(tmp_path / "csv", c.train), rtol=1e-6)
    x = read_inputs(m, src).x  # predict reads it too
    assert x.shape == (n, 3) and np.isfinite(x).all()


def test_a_line_of_another_width_than_the_header_says_why_it_likely_is(tmp_path, capsys):
    body = "\n".join(table()) + "\n"
    cases = {
        "trailing.csv": (
            "a,b,label\n" + body.replace("\n", ",\n", 3),
            "line 2 has 4 values, the header 3: its last value is empty",
        ),
        "unquoted.csv": (
            "name,b,label\nSmith, John,1,a\n" + body,
            "line 2 has 4 values, the header 3: a cell holding the delimiter (',') without quotes?",
        ),
        "short.csv": (
            "a,b,label\n" + body + "0.5,a\n",
            "line 62 has 2 values, the header 3: a value is missing from it",
        ),
    }
    for name, (text, said) in cases.items():
        (tmp_path / name).write_text(text)
        assert main(["data", "prepare", str(tmp_path / name), "--out", str(tmp_path / "o")]) == 2
        assert f"{tmp_path / name}: {said}" in capsys.readouterr().err, name


def test_pretty_printed_json_lines_are_named_as_such(tmp_path, capsys):
    import json

    records = [{"a": i / 10, "label": "ab"[i % 2]} for i in range(40)]
    src = tmp_path / "dump.jsonl"
    src.write_text("\n".join(json.dumps(r, indent=2) for r in records) + "\n")
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "o")]) == 2
    assert (
        f"{src}: line 1 is not JSON (Expecting property name enclosed in double quotes at character 2): a record "
        "spread over several lines (pretty-printed JSON)?" in capsys.readouterr().err
    )
    src.write_text("\n".join(json.dumps(r) for r in records) + "\n")  # as it says: one line each
    assert prepare_dataset(str(src), str(tmp_path / "ok")).train.rows == 32


def test_a_floating_point_tiff_is_refused_not_read_as_black(tmp_path, capsys):
    from PIL import Image

    rng = np.random.default_rng(7)
    for c, base in (("dark", 0.1), ("bright", 0.9)):  # microscopy in 0-1: as 8 bits, every pixel 0 or 1
        (tmp_path / "cells" / c).mkdir(parents=True)
        for i in range(6):
            pixels = (rng.random((16, 16)) * 0.1 + base).astype(np.float32)
            Image.fromarray(pixels, "F").save(tmp_path / "cells" / c / f"{i}.tif")
    assert main(["data", "prepare", str(tmp_path / "cells"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'cells' / 'bright' / '0.tif'}: a 32-bit floating-point image (values 0.9" in err
    assert "an .npz of float arrays" in err and not (tmp_path / "o" / "manifest.json").exists()
    # as it says: the same pixels in an .npz prepare as float images, the classes apart
    x = np.stack(
        [
            np.asarray(Image.open(f), np.float32)
            for c in ("bright", "dark")
            for f in sorted((tmp_path / "cells" / c).iterdir())
        ]
    )
    np.savez(tmp_path / "cells.npz", x=x, y=np.repeat(["bright", "dark"], 6))
    m = prepare_dataset(str(tmp_path / "cells.npz"), str(tmp_path / "npz"))
    assert m.x.shape == [1, 16, 16] and m.x.dtype == "float32" and m.classes == ["bright", "dark"]


def test_a_number_column_named_as_an_id_is_said(tmp_path, caplog):
    import logging

    rng = np.random.default_rng(8)
    ids = rng.permutation(np.arange(10_000, 10_080))  # not in row order: no row number to see
    src = tmp_path / "customers.csv"
    src.write_text(
        "customer_id,userId,age,paid,label\n"
        + "".join(
            f"{i},{j},{rng.integers(18, 80)},{rng.integers(0, 2)},{'ab'[k % 2]}\n"
            for k, (i, j) in enumerate(zip(ids, ids[::-1]))
        )
    )
    with caplog.at_level(logging.INFO, logger="smlt.notice"):
        m = prepare_dataset(str(src), str(tmp_path / "out"))
    for name in ("customer_id", "userId"):
        assert f"column '{name}' is named as an id is, and is read as a number" in caplog.text
        assert f"--drop {name}" in caplog.text
    assert "'age' is named" not in caplog.text and "'paid' is named" not in caplog.text
    assert [c.name for c in m.columns or []] == ["customer_id", "userId", "age", "paid"]  # said, not dropped


def test_a_class_dealt_to_the_validation_split_only_is_said(tmp_path, caplog):
    import logging

    rng = np.random.default_rng(0)
    src = tmp_path / "few.csv"  # 10 and 10 rows of two classes, one of a third: too few rows for "almost none"
    src.write_text("x,label\n" + "".join(f"{rng.random():.3f},{c}\n" for c in ["a"] * 10 + ["b"] * 10 + ["c"]))
    told = {}
    for seed in range(8):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="smlt.notice"):
            m = prepare_dataset(str(src), str(tmp_path / f"s{seed}"), seed=seed)
        counts = (m.train.class_counts or []) + [0, 0, 0]
        told[seed] = "has rows in the validation split only" in caplog.text
        assert told[seed] == (counts[2] == 0), seed  # said exactly when 'c' has no train row
        if told[seed]:
            assert (
                "few.csv: class 'c' (1 row) has rows in the validation split only: a model never learns it"
                in caplog.text
            )
    assert any(told.values()) and not all(told.values())


def test_a_spreadsheets_totals_row_at_the_end_is_refused_when_it_has_a_label(tmp_path, capsys):
    rng = np.random.default_rng(9)
    rows = [f"{i + 1},{'NS'[i % 2]},{rng.uniform(1, 100):.2f},{rng.uniform(100, 900):.1f}" for i in range(60)]
    src = tmp_path / "sales.csv"
    src.write_text("id,region,size,price\n" + "\n".join(rows) + "\nTotal,,3012.55,30001.2\n")
    # even with the column that says it left out of the features
    assert main(["data", "prepare", str(src), "--out", str(tmp_path / "o"), "--label", "price", "--drop", "id"]) == 2
    assert (
        f"{src}: column 'id', line 62 is 'Total': the table's last row is a totals row, not a row of data"
        in capsys.readouterr().err
    )
    # without a label it is a row without one, left out as such; a 'Total' level earlier is data
    src.write_text("id,region,size,price\n" + "\n".join(rows) + "\nTotal,,3012.55,\n")
    assert (
        prepare_dataset(str(src), str(tmp_path / "a"), options=SourceOptions(label="price", drop=["id"])).train.rows
        == 48
    )
    middle = tmp_path / "middle.csv"
    middle.write_text(
        "kind,size,price\n" + "\n".join(f"{'Total' if i == 5 else 'part'},{i},{i * 2.5}" for i in range(60)) + "\n"
    )
    assert prepare_dataset(str(middle), str(tmp_path / "b"), options=SourceOptions(label="price")).train.rows == 48
