"""Datasets: preparation into shards + manifest, and loading shards with a /tmp cache."""

from smlt.data.manifest import Manifest, ShardInfo, SplitInfo
from smlt.data.prepare import prepare_dataset

__all__ = ["Manifest", "ShardInfo", "SplitInfo", "prepare_dataset"]
