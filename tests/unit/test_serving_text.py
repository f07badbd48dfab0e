"""The ONNX export of a table of number and one-hot text columns (smlt.serving kind `columns_text`):
the graph takes the table's cells, `numbers` float32 (NaN for a missing cell) and `text` strings
("" for a missing cell), one-hot encodes, imputes and standardises inside (exporter._table_graph),
and gives what `smlt predict` gives on the same rows: unseen levels, empty cells, numbers of every
size, text cells with whitespace around them as a client sends them (stripped inside, as smlt's CSV
reader strips them). A hashed column keeps `encoded_features`, as torch.export does (no string tensors).

Measured here (torch 2.13, onnx 1.23, onnxruntime 1.31, CPU): the table graph's features equal
`apply_columns`' to the bit; the export's probabilities within 6e-08 of `smlt predict`'s. Run with
-s to see them.
"""

import importlib.util
import json
import re

import numpy as np
import pytest

from smlt.cli import main
from smlt.exporter import SERVED_TOLERANCE, _table_graph, export_model
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import apply_columns, read_table
from smlt.runtime.errors import InvalidDataset
from smlt.serving import served_kind, serving_spec, table_feeds
from tests.unit.untrained import loaded, run_folder, untrained

ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
pytestmark = pytest.mark.skipif(not ONNX, reason="the onnx extra (onnx, onnxscript, onnxruntime) is not installed")

HEADER = "age,sex,fare,port,class,survived"
# rows a server is asked about: an unseen sex and port, empty cells in every column, numbers of every size
NEW = [
    ",male,10,,3,0",
    "30,other,5.5,X,1,1",
    "22,female,,S,2,0",
    "40,,100,Q,,1",
    "0.5,female,512.3292,C,1,1",
    "-3,male,1e6,Southampton,7,0",
    "80, male,0,s,2,0",  # " male" is read "male" (a CSV cell is stripped), "s" none of the levels
]


def _titanic(path, rows=300, seed=0):
    """Numbers with empty cells (age: imputed with an indicator), two one-hot text columns (port
    with empty cells and an indicator), a number column of few values (class)."""
    rng = np.random.default_rng(seed)
    lines = [HEADER]
    for i in range(rows):
        sex = ["male", "female"][int(rng.integers(2))]
        port = "" if i % 17 == 0 else ["S", "C", "Q"][int(rng.integers(3))]
        age = "" if i % 9 == 0 else round(float(rng.uniform(1, 80)), 1)
        fare = round(float(rng.exponential(30)), 2)
        lines.append(f"{age},{sex},{fare},{port},{int(rng.integers(1, 4))},{int(rng.integers(2))}")
    path.write_text("\n".join(lines) + "\n")
    return path


def _model(tmp, src, label, **options):
    manifest = prepare_dataset(str(src), str(tmp / "prepared"), shards=2, options=SourceOptions(label=label, **options))
    card, blob = untrained(manifest, "mlp", run_id="run-text")
    folder = run_folder(tmp / "run", card, blob)
    return loaded(card, blob, str(folder)), folder


@pytest.fixture(scope="module")
def titanic(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("titanic")
    src = _titanic(tmp / "titanic.csv")
    (tmp / "new.csv").write_text("\n".join([HEADER, *NEW]) + "\n")
    model, folder = _model(tmp, src, "survived")
    return model, folder, src, tmp / "new.csv"


def _session(path):
    import onnx
    import onnxruntime

    onnx.checker.check_model(str(path))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session, json.loads(session.get_modelmeta().custom_metadata_map["smlt.serving"])


def test_the_graph_takes_the_tables_cells_and_gives_what_predict_gives(titanic, tmp_path):
    model, _, src, new = titanic
    assert [(t.name, t.kind, t.indicator) for t in model.manifest.columns] == [
        ("age", "numeric", True),
        ("sex", "onehot", False),
        ("fare", "numeric", False),
        ("port", "onehot", True),
        ("class", "numeric", False),
    ]
    for data in (src, new):
        done = export_model(model, "onnx", tmp_path / "m.onnx", data=data)
        assert done.against == "smlt predict" and done.spec is not None and done.spec.kind == "columns_text"
        assert done.max_abs_diff <= SERVED_TOLERANCE
        print(f"{data.name}: {done.rows} rows, max abs diff from smlt predict {done.max_abs_diff:.2e}")

    # as a server without smlt builds the inputs: the spec's column lists, NaN and "" for missing cells
    session, spec = _session(tmp_path / "m.onnx")
    assert [i.name for i in session.get_inputs()] == ["numbers", "text"]
    assert [i.type for i in session.get_inputs()] == ["tensor(float)", "tensor(string)"]
    rows = [dict(zip(HEADER.split(","), line.split(","))) for line in NEW]
    numbers = np.array([[float(r[c]) if r[c] else np.nan for c in spec["columns"]] for r in rows], np.float32)
    text = np.array([[r[c].strip() for c in spec["text_columns"]] for r in rows], object)  # as smlt reads a CSV
    got = session.run(None, {"numbers": numbers, "text": text})[0]
    want = model.predict(new).probabilities
    np.testing.assert_allclose(got, want, rtol=0, atol=SERVED_TOLERANCE)
    # a server that sends the cells as written: the graph strips what smlt's CSV reader strips
    unstripped = np.array([[r[c] for c in spec["text_columns"]] for r in rows], object)
    assert unstripped[6, 0] == " male"
    unstripped[0, 1] = " \t"  # only whitespace: a missing cell, as the CSV reader reads it
    unstripped[2, 0] = "\u00a0female\u3000"  # no-break and ideographic spaces are whitespace too
    np.testing.assert_allclose(
        session.run(None, {"numbers": numbers, "text": unstripped})[0], want, atol=SERVED_TOLERANCE
    )
    print(f"new.csv by hand: max abs diff {np.abs(got - want).max():.2e}")
    assert np.array_equal(numbers, table_feeds(model, new)["numbers"], equal_nan=True)
    assert (text == table_feeds(model, new)["text"]).all()
    one = session.run(None, {"numbers": numbers[1:2], "text": text[1:2].astype(str)})[0]  # numpy str works too
    np.testing.assert_allclose(one, want[1:2], rtol=0, atol=SERVED_TOLERANCE)
    # an unseen value is none of the levels: the same outputs as any other unseen value
    other = text.copy()
    other[1] = ["alien", "Mars"]
    np.testing.assert_array_equal(session.run(None, {"numbers": numbers, "text": other})[0][1], got[1])


def test_the_unseen_output_flags_the_cells_predict_counts(titanic, tmp_path):
    """A second output, `unseen` (bool per row and text column): a cell that is none of its
    column's levels and not missing ('other', 'X', 'Southampton', 's' for 'S'; not "" nor " male"),
    the cells `smlt predict`'s notice counts; the first output as before (a server reading [0])."""
    model, _, _, new = titanic
    done = export_model(model, "onnx", tmp_path / "m.onnx", data=new)
    assert done.unseen == 4 and done.max_abs_diff <= SERVED_TOLERANCE
    session, spec = _session(done.path)
    assert [(o.name, o.type) for o in session.get_outputs()] == [
        ("probabilities", "tensor(float)"),
        ("unseen", "tensor(bool)"),
    ]
    assert [(o["name"], o["dtype"], o["shape"]) for o in spec["outputs"]] == [
        ("probabilities", "float32", ["batch", 2]),
        ("unseen", "bool", ["batch", 2]),
    ]
    rows = [dict(zip(HEADER.split(","), line.split(","))) for line in NEW]
    numbers = np.array([[float(r[c]) if r[c] else np.nan for c in spec["columns"]] for r in rows], np.float32)
    text = np.array([[r[c] for c in spec["text_columns"]] for r in rows], object)  # as written: " male"
    text[0, 1] = " \t"  # only whitespace: missing, not unseen
    probabilities, unseen = session.run(None, {"numbers": numbers, "text": text})
    predicted = model.predict(new)
    np.testing.assert_allclose(probabilities, predicted.probabilities, rtol=0, atol=SERVED_TOLERANCE)
    print(
        f"new.csv with unseen cells: max abs diff from smlt predict {np.abs(probabilities - predicted.probabilities).max():.2e}"
    )
    #            sex    port
    want = [[0, 0], [1, 1], [0, 0], [0, 0], [0, 0], [0, 1], [0, 1]]
    np.testing.assert_array_equal(unseen, np.array(want, bool))
    # smlt predict says the same: per column, the rows its notice counts
    counts = dict(
        re.findall(r"column '(\w+)': (\d+) of 7 rows hold values the model never saw", " ".join(predicted.notes))
    )
    assert counts == {"sex": "1", "port": "3"} == {c: str(n) for c, n in zip(spec["text_columns"], unseen.sum(0))}
    # a client's other letter case, a typo: flagged, one row alone as a server's single request
    for cell, flagged in (("Male", True), ("paris", True), ("female", False), ("", False)):
        one = np.array([[cell, "S"]], object)
        assert session.run(["unseen"], {"numbers": numbers[:1], "text": one})[0].tolist() == [[flagged, False]]


def _spaced(src, out, rows=120):
    """`src`'s rows with whitespace around their text cells as clients and spreadsheets leave it:
    a space before, two after, a tab, a no-break space, a cell of only spaces."""
    head, *lines = src.read_text().splitlines()
    pads = [(" ", ""), ("", "  "), ("\t", " "), ("\u00a0", ""), ("", "")]
    spaced = []
    for i, line in enumerate(lines[:rows]):
        cells = line.split(",")
        for c in (1, 3):
            before, after = pads[(i + c) % len(pads)]
            cells[c] = "   " if not cells[c] and i % 2 else f"{before}{cells[c]}{after}"
        spaced.append(",".join(cells))
    out.write_text("\n".join([head, *spaced]) + "\n")
    return out, [dict(zip(head.split(","), line.split(","))) for line in spaced]


def test_the_table_graph_is_encode_columns_then_the_standardisation(titanic, tmp_path):
    import onnxruntime

    model, _, src, new = titanic
    manifest = model.manifest
    graph = _table_graph(manifest, 20, 10)
    session = onnxruntime.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    spaced, rows = _spaced(src, tmp_path / "spaced.csv")
    for data in (src, new, spaced):
        got = session.run(None, table_feeds(model, data))[0]
        want = apply_columns(manifest, read_table(data, {"age", "fare", "class"}))
        assert got.shape == want.shape == (len(want), manifest.x.shape[0])
        np.testing.assert_array_equal(got, want)  # to the bit
    # the cells as written, whitespace and all: the graph strips it as the CSV reader does
    feeds = table_feeds(model, spaced)
    feeds["text"] = np.array([[r["sex"], r["port"]] for r in rows], object)
    assert any(c != c.strip() for c in feeds["text"].ravel())
    np.testing.assert_array_equal(session.run(None, feeds)[0], want)


def test_an_export_fed_cells_with_whitespace_gives_what_predict_gives(titanic, tmp_path):
    """Measured: before the graph stripped whitespace, 60 of 79 such rows differed from smlt predict
    (max abs diff 0.075); now within 6e-08 (run with -s)."""
    model, _, src, _ = titanic
    spaced, rows = _spaced(src, tmp_path / "spaced.csv")
    done = export_model(model, "onnx", tmp_path / "m.onnx", data=spaced)
    session, spec = _session(done.path)
    numbers = np.array([[float(r[c]) if r[c] else np.nan for c in spec["columns"]] for r in rows], np.float32)
    text = np.array([[r[c] for c in spec["text_columns"]] for r in rows], object)
    got = session.run(None, {"numbers": numbers, "text": text})[0]
    want = model.predict(spaced).probabilities
    print(f"cells with whitespace, {len(rows)} rows: max abs diff from smlt predict {np.abs(got - want).max():.2e}")
    np.testing.assert_allclose(got, want, rtol=0, atol=SERVED_TOLERANCE)


def test_the_default_check_and_a_prepared_folder(titanic, tmp_path):
    """No --data: a seeded batch with each level, an unseen value and empty cells; a prepared
    folder: its stored rows read back as cells."""
    model, folder, _, _ = titanic
    feeds = table_feeds(model)
    assert np.isnan(feeds["numbers"][:, 0]).any() and (feeds["text"][:, 1] == "").any()
    assert (feeds["text"][:, 0] == "<unseen>").any()
    assert export_model(model, "onnx", tmp_path / "a.onnx").max_abs_diff <= SERVED_TOLERANCE
    prepared = folder.parent / "prepared"
    feeds = table_feeds(model, prepared)
    assert (feeds["text"][:, 1] == "").any() and np.isnan(feeds["numbers"][:, 0]).any()
    done = export_model(model, "onnx", tmp_path / "b.onnx", data=prepared)
    assert done.rows == len(feeds["text"]) and done.max_abs_diff <= SERVED_TOLERANCE


def test_the_spec_names_both_inputs_and_their_columns(titanic, tmp_path, capsys):
    model, folder, _, _ = titanic
    spec = serving_spec(model)
    assert (spec.format, spec.kind) == ("smlt-serving/2", "columns_text")
    assert spec.inputs is not None and spec.input == spec.inputs[0]
    assert [(t.name, t.dtype, t.shape) for t in spec.inputs] == [
        ("numbers", "float32", ["batch", 3]),
        ("text", "string", ["batch", 2]),
    ]
    assert (spec.columns, spec.text_columns) == (["age", "fare", "class"], ["sex", "port"])
    assert '"" for a missing cell' in spec.inputs[1].means and "none of the column's levels" in spec.inputs[1].means
    done = export_model(model, "onnx", tmp_path / "m.onnx")
    _, stored = _session(done.path)
    assert stored == json.loads(spec.model_dump_json())

    # torch.export has no string tensors: encoded_features, a /1 spec as before (no /2 keys)
    pt2 = serving_spec(model, fmt="torch-export")
    assert (pt2.format, pt2.kind, pt2.input.name) == ("smlt-serving/1", "encoded_features", "encoded_features")
    assert "inputs" not in json.loads(pt2.model_dump_json()) and "text_columns" not in pt2.model_dump_json()
    assert export_model(model, "torch-export", tmp_path / "m.pt2").spec == pt2

    assert main(["model", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "  input  'numbers' float32 [batch, 3]: one value per number column" in out
    assert "         columns: age, fare, class\n" in out
    assert "  input  'text' string [batch, 2]: one cell per text column" in out
    assert "         columns: sex, port\n" in out
    assert "(--format torch-export, without string tensors: input 'encoded_features' float32 [batch, 10]" in out


def test_a_table_of_text_columns_only(tmp_path):
    """No number column: the graph's one input is `text`. Trained without missing cells (refused):
    an empty cell gives NaN outputs in the graph (as NaN in such a number column), predict refuses it."""
    rng = np.random.default_rng(2)
    lines = ["plan,city,churned"]
    for _ in range(200):
        plan, city = (
            ["free", "pro", "team (5+)"][int(rng.integers(3))],  # a level of regex characters
            ["Oslo", "Lima", "Pune", "Kyiv"][int(rng.integers(4))],
        )
        lines.append(f"{plan},{city},{int(plan == 'free' or rng.random() < 0.3)}")
    src = tmp_path / "plans.csv"
    src.write_text("\n".join(lines) + "\n")
    model, _ = _model(tmp_path, src, "churned", missing="refuse")
    assert all(t.fill is None for t in model.manifest.columns)
    new = tmp_path / "new.csv"
    new.write_text("plan,city,churned\npro,Oslo,0\nenterprise,Lima,1\nfree,Paris,1\n")
    done = export_model(model, "onnx", tmp_path / "m.onnx", data=new)
    assert done.max_abs_diff <= SERVED_TOLERANCE and done.spec is not None
    assert (done.spec.input.name, done.spec.columns, done.spec.text_columns) == ("text", None, ["plan", "city"])
    session, _ = _session(done.path)
    assert [i.name for i in session.get_inputs()] == ["text"]
    text = np.array([["pro", "Oslo"], ["", "Lima"], ["enterprise", "Paris"], ["team (5+) ", " Oslo"]], object)
    got = session.run(None, {"text": text})[0]
    assert np.isnan(got[1]).all() and not np.isnan(got[[0, 2, 3]]).any()
    np.testing.assert_allclose(got[0], model.predict(new).probabilities[0], atol=SERVED_TOLERANCE)
    # the level's characters are characters: "team (5+)" is it, "team (55)" and "team 5" are not
    (tmp_path / "team.csv").write_text("plan,city,churned\nteam (5+),Oslo,0\nteam (55),Oslo,0\nteam 5,Oslo,0\n")
    want = model.predict(tmp_path / "team.csv").probabilities
    cells = np.array([["team (5+) ", "Oslo"], ["team (55)", "Oslo"], ["team 5", "Oslo"]], object)
    np.testing.assert_allclose(session.run(None, {"text": cells})[0], want, atol=SERVED_TOLERANCE)
    assert np.abs(want[0] - want[1]).max() > 1e-4 and np.allclose(want[1], want[2])
    (tmp_path / "empty.csv").write_text("plan,city,churned\n,Lima,1\n")
    with pytest.raises(InvalidDataset, match=r"column 'plan', line 2 is empty: missing values are refused"):
        model.predict(tmp_path / "empty.csv")


def test_a_hashed_column_keeps_encoded_features(tmp_path):
    """One-hot and hashed text (a code of 40 values): no graph form for the hash, the whole table
    is `encoded_features` (a /1 spec), in ONNX too."""
    rng = np.random.default_rng(3)
    lines = ["size,colour,code,label"]
    for _ in range(300):
        k = int(rng.integers(2))
        lines.append(f"{round(float(rng.normal(k, 1)), 3)},{['red', 'blue'][k]},c{int(rng.integers(40))},{k}")
    src = tmp_path / "codes.csv"
    src.write_text("\n".join(lines) + "\n")
    model, _ = _model(tmp_path, src, "label")
    assert [t.kind for t in model.manifest.columns] == ["numeric", "onehot", "hash"]
    assert served_kind(model.manifest, "onnx") == "encoded_features"
    done = export_model(model, "onnx", tmp_path / "m.onnx", data=src)
    assert done.spec is not None and (done.spec.kind, done.spec.format) == ("encoded_features", "smlt-serving/1")
    assert "a hashed or free-text column and a date column have no graph form" in done.spec.input.means
    session, _ = _session(done.path)
    x = model.serving_input(src)[:5]
    got = session.run(None, {"encoded_features": x})[0]
    np.testing.assert_allclose(got, model.predict(src).probabilities[:5], atol=SERVED_TOLERANCE)


def test_a_regression_on_a_dataframe(titanic, tmp_path):
    """Values in the label's units (fare), the rows a DataFrame of numbers, text and empty cells."""
    pd = pytest.importorskip("pandas")
    _, _, src, _ = titanic
    model, _ = _model(tmp_path, src, "fare")
    assert model.card.task == "regression"
    frame = pd.DataFrame(
        {
            "age": [None, 30.0, 7.5],
            "sex": ["male", "other", None],
            "port": ["", "Q", "S"],
            "class": [3, 1, 2],
            "survived": [0, 1, 1],
        }
    )
    done = export_model(model, "onnx", tmp_path / "m.onnx", data=frame)
    assert done.spec is not None and done.spec.kind == "columns_text" and done.spec.output.name == "values"
    std = model.manifest.target.std[0]
    assert done.max_abs_diff <= SERVED_TOLERANCE * std
    session, _ = _session(done.path)
    got = session.run(None, table_feeds(model, frame))[0]
    want = model.predict(frame).values
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=SERVED_TOLERANCE * std)
    print(f"regression on a DataFrame: max abs diff {done.max_abs_diff:.2e} (target std {std:.3g})")
