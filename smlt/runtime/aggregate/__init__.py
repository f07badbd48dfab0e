"""Aggregation (numpy + safetensors; no torch): `reduce` averages the updates (in memory, through a
store, or as k sharded slices), `guard` screens them. Where model r lives is
`smlt.runtime.model_store`, the per-step exchange of synchronous mode `smlt.runtime.exchange` (both
used by the worker too); the tensor bytes they share with the worker are in `smlt.runtime.tensors`."""
