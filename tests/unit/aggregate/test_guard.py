"""The update guard's rule: refuse an update whose norm is more than 10x the round's median."""

import math

import numpy as np

from smlt.runtime.aggregate.guard import NORM_FACTOR, outliers
from smlt.runtime.tensors.digest import update_norm
from smlt.runtime.tensors.format import encode


def test_an_update_far_above_the_median_is_refused_with_its_norm():
    norms = {0: 1.0, 1: 1.2, 2: 1000.0, 3: 0.9}
    got = outliers(norms)
    assert list(got) == [2]
    assert "1000" in got[2] and f"{NORM_FACTOR:g}x" in got[2] and "median update norm 1.1" in got[2]


def test_small_updates_and_the_spread_of_honest_ones_are_kept():
    # a worker cut short at its compute limit sends a small update: never refused
    assert outliers({0: 1.0, 1: 1.6, 2: 0.03, 3: 1.1, 4: 0.8}) == {}
    assert outliers({0: 1.0, 1: 9.9, 2: 1.0}) == {}


def test_fewer_than_three_finite_norms_cannot_name_the_odd_one():
    assert outliers({0: 1.0, 1: 1000.0}) == {}
    assert outliers({0: 1.0, 1: 1000.0, 2: math.nan}) == {}  # NaN: left to the divergence check
    assert list(outliers({0: 1.0, 1: 1000.0, 2: 1.1, 3: math.inf})) == [1]


def test_update_norm_is_the_l2_norm_of_the_floating_tensors():
    blob = encode({"w": np.array([3.0, 4.0], np.float32), "n": np.array([100], np.int64)})
    assert update_norm(blob) == 5.0
    half = encode({"w": np.array([3.0, 4.0], np.float16)})
    assert update_norm(half) == 5.0
