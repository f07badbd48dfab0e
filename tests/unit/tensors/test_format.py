"""The safetensors format, numpy side: zero-copy views."""

from __future__ import annotations

import numpy as np

from smlt.runtime.tensors.format import views


def test_views_are_zero_copy():
    from safetensors.numpy import save

    blob = save({"w": np.arange(10, dtype=np.float32)})
    v, _ = views(blob)
    assert not v["w"].flags.writeable and v["w"].base is not None
    np.testing.assert_array_equal(v["w"], np.arange(10))
