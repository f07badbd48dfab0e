"""Tensor bytes shared by the worker and the aggregator: dtypes, the safetensors format, update
codecs and the flat-vector layout (numpy only), plus `torch_state`, the one module that imports
torch (the planner/aggregate Lambda layer has none)."""
