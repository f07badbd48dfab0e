"""Numbers as a spreadsheet formats them (`$1,234.50`, `7.5%`, `12 €`; `1.234,50` in a file
separated by semicolons) are numbers: prepared to the same shards as the bare numbers, in a label
too, and read the same way to predict. Before, a whole column of them was text, hashed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import read_table


def _rows(n: int = 600) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    price = np.round(rng.uniform(-5_000, 3_000_000, n), 2)
    rate = np.round(rng.uniform(0, 100, n), 1)
    label = (price > 1_000_000).astype(int)
    return price, rate, label


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir()
    path = folder / "houses.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def _shards(manifest) -> list[str]:
    return [s.sha256 for s in manifest.train.shards + manifest.validation.shards]


def _money(v: float, sign: str = "$") -> str:
    return f"-{sign}{-v:,.2f}" if v < 0 else f"{sign}{v:,.2f}"


@pytest.mark.parametrize("style", ["dollars", "euros after", "grouped only"])
def test_formatted_numbers_prepare_to_the_shards_of_the_bare_numbers(tmp_path, style):
    price, rate, label = _rows()
    bare = _write(tmp_path / "bare", ["price,rate,label"] + [f"{p},{r},{y}" for p, r, y in zip(price, rate, label)])
    shown = {
        "dollars": lambda p: f'"{_money(p)}"',
        "euros after": lambda p: f'"{p:,.2f} €"',
        "grouped only": lambda p: f'"{p:,.2f}"',
    }[style]
    formatted = _write(
        tmp_path / "formatted",
        ["price,rate,label"] + [f"{shown(p)},{r}%,{y}" for p, r, y in zip(price, rate, label)],
    )
    a = prepare_dataset(str(bare), str(tmp_path / "a"), shards=2)
    b = prepare_dataset(str(formatted), str(tmp_path / "b"), shards=2)
    assert [c.kind for c in b.columns or []] == ["numeric", "numeric"]
    assert _shards(a) == _shards(b)
    assert np.allclose(read_table(formatted).columns["price"].astype(float), price)


def test_a_semicolon_file_with_grouped_decimal_commas(tmp_path):
    price, rate, label = _rows()

    def euro(v: float) -> str:  # 1.234.567,89
        return f"{v:,.2f}".replace(",", " ").replace(".", ",").replace(" ", ".")

    bare = _write(
        tmp_path / "bare", ["price;label"] + [f"{str(p).replace('.', ',')};{y}" for p, y in zip(price, label)]
    )
    formatted = _write(tmp_path / "formatted", ["price;label"] + [f"{euro(p)};{y}" for p, y in zip(price, label)])
    assert _shards(prepare_dataset(str(bare), str(tmp_path / "a"), shards=2)) == _shards(
        prepare_dataset(str(formatted), str(tmp_path / "b"), shards=2)
    )


def test_a_formatted_regression_label_and_text_that_only_looks_so(tmp_path):
    price, rate, _ = _rows()
    path = _write(
        tmp_path / "t",
        ["rate,code,price"]
        + [f'{r},"{"A-" if i % 2 else ""}{i:,}","{_money(p)}"' for i, (p, r) in enumerate(zip(price, rate))],
    )
    m = prepare_dataset(str(path), str(tmp_path / "p"))
    assert m.task == "regression"
    assert m.target is not None and abs(m.target.mean[0] - price.mean()) < 0.2 * price.std()
    assert [c.kind for c in m.columns or []] == ["numeric", "hash"]  # 'A-1,001' is not a number
