"""Aggregation: sample-weighted averaging of worker deltas (numpy + safetensors; no torch)."""
