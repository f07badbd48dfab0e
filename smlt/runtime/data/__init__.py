"""Datasets: preparation into shards + manifest, and loading shards with a /tmp cache."""

from smlt.runtime.data.manifest import Manifest, ShardInfo, SplitInfo
from smlt.runtime.data.options import SourceOptions
from smlt.runtime.data.prepare import prepare_dataset
from smlt.runtime.data.tabular import apply_columns, read_table

__all__ = ["Manifest", "ShardInfo", "SourceOptions", "SplitInfo", "apply_columns", "prepare_dataset", "read_table"]
