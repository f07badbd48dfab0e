"""Aggregation (numpy + safetensors; no torch): `reduce` averages the updates (in memory, through a
store, or as k sharded slices), `model_store` says where model r lives and reads or writes it,
`sync` is the per-step gradient exchange of synchronous mode, `parallel` the bounded fan-out of
their GETs. The tensor bytes they share with the worker are in `smlt.runtime.tensors`."""
