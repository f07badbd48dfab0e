"""The training runtime (PyTorch): models and the worker's local-SGD round."""
