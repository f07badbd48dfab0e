"""Datasets: preparation into shards + manifest, and loading shards with a /tmp cache."""

from smlt.data.manifest import Manifest, ShardInfo, SplitInfo
from smlt.data.options import SourceOptions
from smlt.data.prepare import prepare_dataset
from smlt.data.tabular import apply_columns, read_table

__all__ = ["Manifest", "ShardInfo", "SourceOptions", "SplitInfo", "apply_columns", "prepare_dataset", "read_table"]
