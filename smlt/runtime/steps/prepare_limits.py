"""What one PrepareData function prepares, and the named errors of an upload it refuses: shared by
the single-function path (`smlt.runtime.steps.prepare`) and the parts' path
(`smlt.runtime.steps.upload_parts`, `prepare_parts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from smlt.runtime.errors import InvalidDataset

# --- what one function prepares -------------------------------------------------------------
# The function: Lambda's longest timeout, the memory a new account may deploy (3,008 MB: the
# deploy's default memory tiers need it too), Lambda's largest /tmp. Every measured number below
# is in bench/results/prepare_memory.json (bench/prepare_memory.py; bench/README.md, "Preparation
# memory"); tests/unit/test_prepare_step.py checks them against it.
PREPARE_TIMEOUT_S = 900
PREPARE_MEMORY_MB = 3008
PREPARE_EPHEMERAL_MB = 10_240
MB = 1_000_000
MIB = 1 << 20

# Tabular (CSV, Parquet, an archive of one): streamed in bounded memory (444 MB peak for 5,006 MB of
# CSV), so /tmp and time bind. /tmp holds the download (an archive's extraction in its place, the
# archive deleted) and the rows spooled for the shards: 1.02 bytes per byte of CSV measured (5,088 MB
# of shards), with a fifth of /tmp kept for inputs that widen more (one-hot columns of many levels).
TABLE_SPOOL_RATIO = 1.02
TMP_SHARE = 0.8
TABLE_TMP_BYTES = int(TMP_SHARE * PREPARE_EPHEMERAL_MB * MIB / (1 + TABLE_SPOOL_RATIO))  # 4.25 GB
# Time: 32.5 MB/s of CSV per core measured (both passes), taken at half (a Lambda vCPU slower than
# a core here, wider inputs); the download and the shards' upload at a function's sustained
# ~75 MiB/s (facts.md, Skyrise); a minute kept for the image's cold start and the manifest.
TABLE_MB_PER_S = 32.5
VCPU_SLOWDOWN = 2.0
S3_MB_PER_S = 75 * MIB / MB
PREPARE_RESERVE_S = 60
TABLE_S_PER_MB = VCPU_SLOWDOWN / TABLE_MB_PER_S + (1 + TABLE_SPOOL_RATIO) / S3_MB_PER_S
TABLE_TIME_BYTES = int((PREPARE_TIMEOUT_S - PREPARE_RESERVE_S) / TABLE_S_PER_MB * MB)  # 9.6 GB
# /tmp binds: 4.2 GB (rounded down to 100 MB), prepared in about 430 s by the rates above.
MAX_TABLE_BYTES = min(TABLE_TMP_BYTES, TABLE_TIME_BYTES) // (100 * MB) * (100 * MB)

# A CSV or JSON Lines file compressed whole (.gz, .bz2, .xz) unpacks as it streams to an unknown
# size: text tables compress 3-10x, so a tenth of the table limit keeps the unpacked rows within it.
COMPRESSION_ALLOWANCE = 10
MAX_COMPRESSED_TABLE_BYTES = MAX_TABLE_BYTES // COMPRESSION_ALLOWANCE

# An Excel workbook (.xlsx, .xlsm) is turned into CSV first (smlt.runtime.data.workbook): openpyxl
# parses its sheet's XML in Python: 6.7 MB, 100,000 rows x 10 columns, turned into CSV in 6.3 s of
# CPU (1.1 MB/s), in 8.1 s when its sheet states no range (streaming writers), which openpyxl then
# parses twice; taken as 0.7 MB/s per core. Time binds long before /tmp does. Taken at half on a Lambda vCPU,
# and at a third again for a workbook that packs more cells into a byte (repeated values), with the
# CSV's own pass inside that margin.
WORKBOOK_MB_PER_S = 0.7
WORKBOOK_ALLOWANCE = 3
MAX_WORKBOOK_BYTES = (
    int((PREPARE_TIMEOUT_S - PREPARE_RESERVE_S) * WORKBOOK_MB_PER_S / VCPU_SLOWDOWN / WORKBOOK_ALLOWANCE * MB)
    // (10 * MB)
    * (10 * MB)
)  # 90 MB

# In memory (NPZ, an image folder, an archive of one): loaded whole, so memory binds. Peak RSS
# grows by RSS_PER_MB bytes per byte of arrays (NPZ: x, its split copies and the standardised
# float32 features, 3.13 measured at 100-400 MB; images: the uint8 pixels and their split copies,
# 1.91 per byte of decoded pixels at 115-460 MB). Of the function's memory a fifth is kept (the
# allocator, the runtime), less a baseline: the function's imports (116.4 MB measured), the kind's
# own 2 MB prepare (88 and 141 MB measured: the interpreter counted twice) and one shard in flight
# to S3 (64 MiB).
MEMORY_SHARE = 0.8
FUNCTION_IMPORTS_MB = 116.4
SHARD_MB = 64
BASELINE_MB = {"arrays": 87.8, "images": 141.2}
RSS_PER_MB = {"arrays": 3.13, "images": 1.91}


def _memory_bytes(kind: Literal["arrays", "images"]) -> int:
    left = MEMORY_SHARE * PREPARE_MEMORY_MB - FUNCTION_IMPORTS_MB - BASELINE_MB[kind] - SHARD_MB  # MiB
    return int(left * MIB / RSS_PER_MB[kind]) // (100 * MB) * (100 * MB)


MAX_ARRAYS_BYTES = _memory_bytes("arrays")  # 700 MB of NPZ arrays
MAX_PIXELS_BYTES = _memory_bytes("images")  # 1.1 GB of decoded pixels


@dataclass(frozen=True)
class Limit:
    """What one function prepares of a kind of input: at most `bytes` of `measure`, because `why`."""

    kind: str
    bytes: int
    measure: str
    why: str


TABLE_LIMIT = Limit(
    "a CSV or Parquet file",
    MAX_TABLE_BYTES,
    "",
    f"its {PREPARE_EPHEMERAL_MB:,} MB of /tmp holds the download and the rows spooled for the shards, about as "
    "many bytes again",
)
COMPRESSED_TABLE_LIMIT = Limit(
    "a compressed CSV or JSON Lines file",
    MAX_COMPRESSED_TABLE_BYTES,
    "",
    f"it may unpack to {COMPRESSION_ALLOWANCE} times its bytes, and {TABLE_LIMIT.kind} is prepared up to "
    f"{MAX_TABLE_BYTES // MB:,} MB: {TABLE_LIMIT.why}",
)
WORKBOOK_LIMIT = Limit(
    "an Excel workbook",
    MAX_WORKBOOK_BYTES,
    "",
    f"its cells are read at about {WORKBOOK_MB_PER_S:g} MB of workbook per second, within its "
    f"{PREPARE_TIMEOUT_S} s (save it as CSV UTF-8 to upload up to {MAX_TABLE_BYTES // MB:,} MB)",
)
ARRAYS_LIMIT = Limit(
    "an NPZ file",
    MAX_ARRAYS_BYTES,
    " of arrays",
    f"its arrays are loaded whole into its {PREPARE_MEMORY_MB:,} MB of memory, about {RSS_PER_MB['arrays']:g} "
    "times their bytes at the peak",
)
IMAGES_LIMIT = Limit(
    "an image folder",
    MAX_PIXELS_BYTES,
    " of decoded pixels",
    f"its images are decoded whole into its {PREPARE_MEMORY_MB:,} MB of memory, about {RSS_PER_MB['images']:g} "
    "times their pixels' bytes at the peak",
)
# An archive before it is downloaded, whatever it holds: the largest any kind allows (a table's);
# its members are held to their own kind's limit before it is extracted.
MAX_INPUT_BYTES = max(MAX_TABLE_BYTES, MAX_ARRAYS_BYTES, MAX_PIXELS_BYTES)
ARCHIVE_LIMIT = Limit(
    "an archive", MAX_INPUT_BYTES, "", f"the most of any kind it may hold, {TABLE_LIMIT.kind}: {TABLE_LIMIT.why}"
)

ARRAY_SUFFIXES = (".npz",)
# A few preparing notices travel in the answer (the execution's history shows them).
MAX_NOTES = 10


class NoDataFile(InvalidDataset):
    """A _SUCCESS marker with no data beside it (the prefix is named)."""


class MixedUpload(InvalidDataset):
    """More than one data source beside the marker (each is named): one version is one source."""


class UnsupportedFormat(InvalidDataset):
    """A file beside the marker that smlt does not prepare (named, with the formats it does)."""


class AlreadyPrepared(InvalidDataset):
    """A marker beside a prepared dataset (manifest.json): the manifest's upload starts its own run."""


class TooLargeForLambda(InvalidDataset):
    """An input over its kind's Limit: prepare it from a machine (`smlt data prepare`)."""


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n:,} bytes"


FORMATS = (
    "a .csv, .tsv, .txt, .parquet, .jsonl, .xlsx or .npz file (a .csv, .tsv, .txt or .jsonl also compressed: .gz, "
    ".bz2, .xz), "
    "an image folder (one subfolder of images per class) or a .zip/.tar(.gz, .bz2, .xz) of one"
)


def ignored(name: str) -> bool:
    """Names a data source never includes: the marker and anything starting with "_" or "."
    (Spark's _committed/_started files, .crc checksums, .DS_Store), and folder placeholders."""
    return name.endswith("/") or any(part.startswith(("_", ".")) for part in name.split("/"))
