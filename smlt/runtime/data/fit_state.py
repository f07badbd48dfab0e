"""The statistics of a table's parts as bytes and back (smlt.runtime.data.parts): what one
Distributed Map child writes to the run's scratch prefix and the step after the Map reads.

JSON (no pickle: the scratch objects are data, never code), for a closed set of classes: the
pass-1 fits (`TableFit` and its parts), the transforms and the moments; numpy arrays as
zlib-compressed bytes (a median's 2^16-bin histogram is mostly zeros), sets, tuples and dicts
with non-text keys tagged so they come back as they were."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import numpy as np
from pydantic import BaseModel

from smlt.runtime.data import manifest
from smlt.runtime.data.leaks import LabelLeaks
from smlt.runtime.data.prepare import TableTransforms
from smlt.runtime.data.stats import Levels, Median, Moments
from smlt.runtime.data.table_fit import ColumnFit, LabelFit, Labels, TableFit
from smlt.runtime.data.table_reader import DateShape

_OBJECTS: dict[str, type] = {
    c.__name__: c
    for c in (TableFit, LabelFit, ColumnFit, LabelLeaks, Median, Levels, Moments, TableTransforms, Labels, DateShape)
}
_MODELS: dict[str, type[BaseModel]] = {
    c.__name__: c
    for c in (
        manifest.ColumnTransform,
        manifest.FeatureSpec,
        manifest.ArraySpec,
        manifest.Normalization,
        manifest.TargetScaling,
        manifest.SplitInfo,
    )
}


def _out(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        raw = base64.b64encode(zlib.compress(np.ascontiguousarray(v).tobytes())).decode()
        return {"__a": v.dtype.str, "s": list(v.shape), "b": raw}
    if isinstance(v, list):
        return [_out(x) for x in v]
    if isinstance(v, tuple):
        return {"__t": [_out(x) for x in v]}
    if isinstance(v, set):
        return {"__s": [_out(x) for x in sorted(v, key=repr)]}
    if isinstance(v, dict):
        if all(isinstance(k, str) for k in v):
            return {"__d": {k: _out(x) for k, x in v.items()}}
        return {"__k": [[_out(k), _out(x)] for k, x in v.items()]}
    if isinstance(v, BaseModel) and type(v).__name__ in _MODELS:
        return {"__m": type(v).__name__, "d": v.model_dump(mode="python")}
    name = type(v).__name__
    if _OBJECTS.get(name) is type(v):
        return {"__o": name, "d": {k: _out(x) for k, x in vars(v).items()}}
    raise TypeError(f"fit_state: cannot store a {name}")


def _in(v: Any) -> Any:
    if isinstance(v, list):
        return [_in(x) for x in v]
    if not isinstance(v, dict):
        return v
    if "__a" in v:
        raw = zlib.decompress(base64.b64decode(v["b"]))
        return np.frombuffer(raw, np.dtype(v["__a"])).reshape(v["s"]).copy()
    if "__t" in v:
        return tuple(_in(x) for x in v["__t"])
    if "__s" in v:
        return {_in(x) for x in v["__s"]}
    if "__d" in v:
        return {k: _in(x) for k, x in v["__d"].items()}
    if "__k" in v:
        return {_in(k): _in(x) for k, x in v["__k"]}
    if "__m" in v:
        return _MODELS[v["__m"]].model_validate(v["d"])
    if "__o" in v:
        obj: Any = object.__new__(_OBJECTS[v["__o"]])
        obj.__dict__.update({k: _in(x) for k, x in v["d"].items()})
        return obj
    raise ValueError(f"fit_state: unknown value {sorted(v)}")


def dumps(value: Any) -> bytes:
    return json.dumps(_out(value), separators=(",", ":")).encode()


def loads(blob: bytes) -> Any:
    return _in(json.loads(blob))
