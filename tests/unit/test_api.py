"""The Python API's names on the top package: loaded on first use (`smlt.tune` the API's study
runner; the studies client is smlt.studies), an unknown name an AttributeError."""

import pytest

import smlt
from smlt import api


def test_the_api_names_resolve_lazily():
    assert smlt.train is api.train and smlt.load_model is api.load_model and smlt.predict is api.predict
    assert smlt.export is api.export and smlt.TrainResult is api.TrainResult
    from smlt import tune

    assert tune is smlt.tune is api.tune and callable(tune)
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        smlt.trian  # noqa: B018


def test_a_bad_reference_is_a_named_error(tmp_path):
    from smlt.runtime.errors import RunNotFound
    from smlt.runtime.modelcard import InvalidModel

    with pytest.raises(RunNotFound, match="no local run 'nope' is saved under"):
        smlt.load_model("nope", out=tmp_path)
    with pytest.raises(InvalidModel, match="no model.safetensors here"):
        smlt.load_model(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(InvalidModel, match="not a safetensors file"):
        smlt.load_model(tmp_path)
