"""smlt: serverless, adaptive ML training on AWS Lambda and Step Functions.

The Python API (smlt.api: `train`, `tune`, `load_model`, `predict`, `export`) is imported on the
first use of one of its names, so `import smlt` imports nothing: the Lambda layer ships this file
with smlt/runtime/ only (infra/stacks/bundling.py) and never needs the client.
"""

_API = frozenset(
    {
        "train",
        "tune",
        "load_model",
        "predict",
        "export",
        "TrainResult",
        "StudyResult",
        "LoadedModel",
        "Predictions",
        "Exported",
    }
)


def __getattr__(name: str) -> object:
    if name in _API:
        from smlt import api

        return getattr(api, name)
    raise AttributeError(f"module 'smlt' has no attribute {name!r}")
