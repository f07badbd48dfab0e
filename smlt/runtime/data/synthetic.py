"""Synthetic datasets, generated from a seed (no downloads): `synthetic:KIND?param=value&...`.

- `classification?rows&features&classes&seed`: tabular features (scikit-learn's make_classification).
- `images?rows&size&channels&classes&seed`: uint8 C x size x size images whose class is a shape or a
  texture (circle, ring, square, cross, triangle, stripes three ways, checks, dots) at a random place,
  scale and phase, in random colours with noise: a small CNN learns them, the mean colour says nothing.
- `tokens?rows&length&vocab&classes&seed`: int64 sequences of random tokens holding two key tokens;
  the class is which two keys occur and in which order, so a bag of words gets only half of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import parse_qsl

import numpy as np

from smlt.runtime.errors import InvalidDataset


@dataclass
class Generated:
    x: np.ndarray
    y: np.ndarray
    name: str
    vocab_size: int | None = None


def query(source: str, allowed: dict[str, int]) -> dict[str, int]:
    """`name?a=1&b=2`'s integer parameters over `allowed`'s defaults; an unknown or non-integer
    parameter is an InvalidDataset naming it."""
    _, _, text = source.partition("?")
    params = dict(allowed)
    for key, text_value in parse_qsl(text, keep_blank_values=True):
        if key not in allowed:
            raise InvalidDataset(f"{source}: unknown parameter {key!r}; known: {', '.join(allowed)}")
        try:
            params[key] = int(text_value)
        except ValueError:
            raise InvalidDataset(f"{source}: {key} must be a whole number, got {text_value!r}") from None
    for key, value in params.items():
        if value < (0 if key == "seed" else 1):
            raise InvalidDataset(f"{source}: {key} must be {'>= 0' if key == 'seed' else 'positive'}, got {value}")
    return params


def classification(source: str) -> Generated:
    p = query(source, {"rows": 10000, "features": 32, "classes": 10, "seed": 0})
    from sklearn.datasets import make_classification

    rows, feats = p["rows"], p["features"]
    x, y = make_classification(
        n_samples=rows,
        n_features=feats,
        n_informative=max(2, feats // 2),
        n_redundant=feats // 8,
        n_classes=p["classes"],
        n_clusters_per_class=2,
        class_sep=1.5,
        flip_y=0.01,
        random_state=p["seed"],
    )
    return Generated(x.astype(np.float32), y, f"synthetic-{rows}x{feats}")


# Each pattern: a 0/1 mask over the (rows, size, size) grid from per-row centre (cx, cy), scale r
# and phase, all in pixels. Shapes sit somewhere in the image; textures fill it.
Pattern = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _patterns(yy: np.ndarray, xx: np.ndarray) -> list[Pattern]:
    def disc(cx, cy, r, ph):
        return (xx - cx) ** 2 + (yy - cy) ** 2 < r**2

    def ring(cx, cy, r, ph):
        d = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2)
        return np.abs(d - r) < np.maximum(1.0, r / 4)

    def square(cx, cy, r, ph):
        return np.maximum(np.abs(xx - cx), np.abs(yy - cy)) < r * 0.8

    def cross(cx, cy, r, ph):
        dx, dy, w = np.abs(xx - cx), np.abs(yy - cy), np.maximum(1.0, r / 3)
        return ((dx < w) & (dy < r)) | ((dy < w) & (dx < r))

    def triangle(cx, cy, r, ph):
        dy = yy - (cy - r)  # apex at the top, base at cy + r
        return (dy > 0) & (dy < 2 * r) & (np.abs(xx - cx) < dy / 2)

    def period(r):
        return np.maximum(3.0, r / 2)

    def hstripes(cx, cy, r, ph):
        return np.sin(2 * np.pi * yy / period(r) + ph) > 0

    def vstripes(cx, cy, r, ph):
        return np.sin(2 * np.pi * xx / period(r) + ph) > 0

    def diagonal(cx, cy, r, ph):
        return np.sin(2 * np.pi * (xx + yy) / (1.4 * period(r)) + ph) > 0

    def checks(cx, cy, r, ph):
        t = 2 * np.pi / period(r)
        return np.sin(t * xx + ph) * np.sin(t * yy + ph) > 0

    def dots(cx, cy, r, ph):
        t = 2 * np.pi / period(r)
        return (np.cos(t * xx + ph) > 0.5) & (np.cos(t * yy + ph) > 0.5)

    return [disc, ring, square, cross, triangle, hstripes, vstripes, diagonal, checks, dots]


def images(source: str) -> Generated:
    p = query(source, {"rows": 10000, "size": 32, "channels": 3, "classes": 10, "seed": 0})
    rows, size, channels, classes = p["rows"], p["size"], p["channels"], p["classes"]
    if size < 8:
        raise InvalidDataset(f"{source}: size must be at least 8 pixels, got {size}")
    if channels not in (1, 3):
        raise InvalidDataset(f"{source}: channels must be 1 or 3, got {channels}")
    if classes < 2:
        raise InvalidDataset(f"{source}: classes must be at least 2, got {classes}")
    rng = np.random.default_rng(p["seed"])
    y = rng.integers(0, classes, rows)
    x = np.empty((rows, channels, size, size), np.uint8)
    for start in range(0, rows, 2048):  # bounded float temporaries
        stop = min(rows, start + 2048)
        x[start:stop] = _draw(y[start:stop], size, channels, rng)
    return Generated(x, y, f"synthetic-images-{rows}x{channels}x{size}x{size}")


def _draw(y: np.ndarray, size: int, channels: int, rng: np.random.Generator) -> np.ndarray:
    n = len(y)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    patterns = _patterns(yy[None], xx[None])
    r = rng.uniform(size * 0.18, size * 0.32, (n, 1, 1))
    cx, cy = (rng.uniform(r, size - r) for _ in range(2))
    ph = rng.uniform(0, 2 * np.pi, (n, 1, 1))
    mask = np.zeros((n, size, size), bool)
    for k, pattern in enumerate(patterns):
        rows = (y % len(patterns)) == k
        if rows.any():
            mask[rows] = pattern(cx[rows], cy[rows], r[rows], ph[rows])
    # Random colours with a guaranteed contrast; classes beyond the ten patterns differ by the
    # foreground's tint, a cue the net must combine with the pattern.
    bg = rng.uniform(0, 255, (n, channels, 1, 1))
    fg = (bg + rng.uniform(90, 165, (n, channels, 1, 1))) % 255
    tint = (y // len(patterns)).reshape(n, 1, 1, 1)
    fg = (fg + 60 * tint) % 255
    img = np.where(mask[:, None], fg, bg) + rng.normal(0, 18, (n, channels, size, size))
    return np.clip(img, 0, 255).astype(np.uint8)


def tokens(source: str) -> Generated:
    p = query(source, {"rows": 10000, "length": 64, "vocab": 1000, "classes": 4, "seed": 0})
    rows, length, vocab, classes = p["rows"], p["length"], p["vocab"], p["classes"]
    pairs = _key_pairs(classes)
    keys = max(max(pair) for pair in pairs)
    if length < 2 or vocab < keys + 2:
        raise InvalidDataset(f"{source}: {classes} classes need length >= 2 and vocab >= {keys + 2}")
    rng = np.random.default_rng(p["seed"])
    y = rng.integers(0, classes, rows)
    # Background tokens avoid 0 (left for padding) and the key tokens 1..keys.
    x = rng.integers(keys + 1, vocab, (rows, length), dtype=np.int64)
    first = rng.integers(0, length - 1, rows)
    second = rng.integers(first + 1, length)
    pair = np.asarray(pairs, np.int64)[y]
    x[np.arange(rows), first] = pair[:, 0]
    x[np.arange(rows), second] = pair[:, 1]
    return Generated(x, y, f"synthetic-tokens-{rows}x{length}", vocab_size=vocab)


def _key_pairs(classes: int) -> list[tuple[int, int]]:
    """Class c's two key tokens in their order: (1, 2), (2, 1), (1, 3), (3, 1), ... so classes
    2c and 2c + 1 hold the same keys and differ only in which comes first."""
    if classes < 2:
        raise InvalidDataset(f"synthetic:tokens: classes must be at least 2, got {classes}")
    pairs = []
    for b in range(2, classes + 2):
        for a in range(1, b):
            pairs += [(a, b), (b, a)]
    return pairs[:classes]


GENERATORS: dict[str, Callable[[str], Generated]] = {
    "classification": classification,
    "images": images,
    "tokens": tokens,
}


def generate(source: str) -> Generated:
    kind = source.split(":", 1)[1].split("?", 1)[0] or "classification"
    if kind not in GENERATORS:
        raise InvalidDataset(f"synthetic dataset kind {kind!r} not supported (use {', '.join(GENERATORS)})")
    return GENERATORS[kind](source)
