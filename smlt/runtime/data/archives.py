"""A dataset that arrives as an archive (`.zip`, `.tar`, `.tar.gz`/`.tgz`, `.tar.bz2`/`.tbz2`,
`.tar.xz`/`.txz`): its contents read as the folder they hold, an image folder, one table file or
the parts of one table, wherever such a folder is a source (`smlt data prepare`, a job's
`dataset.uri`, `smlt predict`, the stack's PrepareData).

Read with the standard library (zipfile, tarfile), listed and checked whole before a byte is
written (`members`), then extracted member by member into a temporary folder (`unpacked`):

- left out: the noise archivers add (`__MACOSX/`, `.DS_Store`, `Thumbs.db`, `desktop.ini`, any
  name starting with `.` or `_`, as a folder's own are), and folders themselves;
- one folder wrapping everything (`images.zip` holding `images/cat/...`) is stepped into;
- refused by name (archive and member): an empty archive, a corrupt or truncated one, a
  password-protected (encrypted) zip member, a link, device or other non-file member, a name
  outside the archive (absolute, or with `..`), an archive inside the archive, contents larger
  than `MAX_UNPACKED_BYTES` or than the disk left, and a member that unpacks to more than
  `MAX_RATIO` times its packed bytes (a zip bomb; once past `RATIO_FLOOR`).

Each member is written as the bytes its header declares, never more (zipfile stops at the
declared size and checks the CRC; a tar member is its declared size), so the checks of the
listing bound what is written.
"""

from __future__ import annotations

import contextlib
import logging
import lzma
import posixpath
import shutil
import stat
import tarfile
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from smlt.runtime.errors import InvalidDataset

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tbz", ".tar.xz", ".txz")
ARCHIVE_KINDS = ".zip, .tar, .tar.gz/.tgz, .tar.bz2 or .tar.xz"  # what ARCHIVE_SUFFIXES are, for messages

# Names archivers add beside the data (macOS resource forks and Finder files, Windows thumbnails).
NOISE = {"__MACOSX", ".DS_Store", "Thumbs.db", "desktop.ini"}

# The most an archive's contents may unpack to on a machine (the disk left binds first, usually).
MAX_UNPACKED_BYTES = 100 * 10**9
# A member unpacking to more than this many times its packed bytes is refused, once the archive's
# contents pass RATIO_FLOOR: a real table compresses 3-20x (a CSV of one repeated row about 300x);
# deflate cannot pass about 1,032x, so past it lies only a bzip2/xz bomb or a nested one.
MAX_RATIO = 500
RATIO_FLOOR = 256 * 2**20
# The share of the free disk an extraction may take (the rows spooled for the shards come after it).
DISK_MARGIN = 0.9
COPY_BYTES = 1 << 20

UNREADABLE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    tarfile.TarError,
    EOFError,
    zlib.error,
    lzma.LZMAError,
    OSError,
    ValueError,  # bz2: data after the end of its stream
)


class BadArchive(InvalidDataset):
    """An archive smlt does not unpack: corrupt, empty, encrypted, unsafe or too large (named, with what to do)."""


def is_archive(name: str | Path) -> bool:
    """An archive by its name (`houses.csv.gz` is a compressed table, not an archive)."""
    return str(name).lower().endswith(ARCHIVE_SUFFIXES)


def is_archive_file(data: object) -> bool:
    """A path (str or Path) to an existing file named as an archive."""
    return isinstance(data, (str, Path)) and is_archive(data) and Path(data).is_file()


def stem(name: str | Path) -> str:
    """The archive's name without its suffix: `images.tar.gz` -> `images`."""
    base = Path(name).name
    low = base.lower()
    for suffix in sorted(ARCHIVE_SUFFIXES, key=len, reverse=True):
        if low.endswith(suffix):
            return base[: -len(suffix)] or base
    return Path(base).stem


@dataclass(frozen=True)
class Member:
    """A file of the archive to extract: its cleaned relative path, unpacked and packed bytes."""

    name: str
    size: int
    packed: int
    source: zipfile.ZipInfo | tarfile.TarInfo


def noise(name: str) -> bool:
    """A name a data source never includes (NOISE, or a part starting with `.` or `_`)."""
    return any(part in NOISE or part.startswith((".", "_")) for part in name.split("/"))


def _clean(where: str, raw: str) -> str:
    """A member's name as a relative POSIX path, or refused when it would land outside the folder
    (absolute, a drive, `..`). Backslashes are separators (zips made on Windows)."""
    name = raw.replace("\\", "/")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or (parts and len(parts[0]) == 2 and parts[0][1] == ":") or ".." in parts:
        raise BadArchive(
            f"{where}: member {raw!r} points outside the archive (an absolute path or '..'), which smlt never "
            "extracts: archive the folder itself, from inside it (zip -r data.zip images/)"
        )
    return posixpath.join(*parts) if parts else ""


def _unreadable(where: str, e: BaseException) -> BadArchive:
    kind = "zip" if where.lower().endswith(".zip") else "tar"
    why = "; ".join(line.strip("- ") for line in str(e).splitlines() if line.strip()) or type(e).__name__
    return BadArchive(
        f"{where}: not a readable {kind} archive ({why}): it may be truncated (an interrupted download or copy) or "
        "of another format under this name; download or make it again"
    )


@contextlib.contextmanager
def _opened(archive: Path, where: str) -> Iterator[zipfile.ZipFile | tarfile.TarFile]:
    try:
        if archive.name.lower().endswith(".zip") or zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                yield z
        else:
            with _tar(archive) as t:
                yield t
    except BadArchive:
        raise
    except UNREADABLE as e:
        raise _unreadable(where, e) from None


def _tar(archive: Path) -> tarfile.TarFile:
    """A tar, compressed as its content says; one that opens in no way is refused with the reason
    of the compression its name says (`.tgz`: not a gzip file)."""
    try:
        return tarfile.open(archive, "r:*")
    except tarfile.ReadError:
        low = archive.name.lower()
        if low.endswith((".gz", ".tgz")):
            return tarfile.open(archive, "r:gz")  # raises the reason
        if low.endswith((".bz2", ".tbz2", ".tbz")):
            return tarfile.open(archive, "r:bz2")
        if low.endswith((".xz", ".txz")):
            return tarfile.open(archive, "r:xz")
        raise


def _zip_members(z: zipfile.ZipFile, where: str) -> Iterator[Member]:
    for info in z.infolist():
        if info.is_dir():
            continue
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode):
            raise BadArchive(
                f"{where}: member {info.filename!r} is a symbolic link, which smlt never follows: zip the files "
                "themselves (zip without -y)"
            )
        if info.flag_bits & 0x1:
            raise BadArchive(
                f"{where}: member {info.filename!r} is password-protected (encrypted): unzip it with its password "
                "and give the folder, or zip it again without one"
            )
        yield Member(_clean(where, info.filename), info.file_size, info.compress_size, info)


def _tar_members(t: tarfile.TarFile, where: str) -> Iterator[Member]:
    for info in t:  # header by header, as the stream is read
        if info.isdir():
            continue
        if not info.isfile():
            what = "a link" if info.issym() or info.islnk() else "a device, pipe or other special file"
            raise BadArchive(
                f"{where}: member {info.name!r} is {what}, which smlt never extracts: archive the files "
                "themselves (tar -h follows links)"
            )
        yield Member(_clean(where, info.name), info.size, info.size, info)


def members(archive: Path, where: str | None = None) -> list[Member]:
    """The archive's files to extract (noise left out), checked: readable, not encrypted, no
    link, device or name outside it, at least one file, no archive inside it."""
    where = where or str(archive)
    packed = archive.stat().st_size
    with _opened(archive, where) as a:
        try:
            found: list[Member] = []
            total = 0
            for m in _zip_members(a, where) if isinstance(a, zipfile.ZipFile) else _tar_members(a, where):
                found.append(m)
                total += m.size
                # a compressed tar is listed by decompressing it: a bomb is stopped as soon as it shows
                if total > MAX_UNPACKED_BYTES or (total > RATIO_FLOOR and total > MAX_RATIO * packed):
                    check_sizes(archive, found, where, MAX_UNPACKED_BYTES, "unpack it yourself and give the folder")
        except BadArchive:
            raise
        except UNREADABLE as e:
            raise _unreadable(where, e) from None
    kept = [m for m in found if m.name and not noise(m.name)]
    if not kept:
        left = (
            f" ({len(found)} file{'s' * (len(found) != 1)} of {', '.join(sorted(NOISE))} or dot-files)" if found else ""
        )
        raise BadArchive(f"{where} holds no data{left}: archive the image folder or the table file itself")
    inner = [m.name for m in kept if is_archive(m.name)]
    if inner:
        raise BadArchive(
            f"{where}: member {inner[0]!r} is an archive inside the archive, which smlt does not unpack: unpack it "
            "and archive (or give) its contents"
        )
    return kept


def check_sizes(archive: Path, listed: list[Member], where: str, max_bytes: int, advice: str) -> int:
    """The contents' unpacked bytes, refused over `max_bytes` (what `advice` says to do) or,
    past RATIO_FLOOR, with a member unpacking to more than MAX_RATIO times its packed bytes
    (a tar's members by the whole archive's bytes, which its compression covers as one)."""
    total = sum(m.size for m in listed)
    largest = max(listed, key=lambda m: m.size)
    if total > max_bytes:
        raise BadArchive(
            f"{where} unpacks to {_gb(total)} (its largest member {largest.name!r}, {_gb(largest.size)}), more "
            f"than {_gb(max_bytes)}: {advice}"
        )
    if total <= RATIO_FLOOR:
        return total
    if isinstance(largest.source, tarfile.TarInfo):  # compressed as one stream: the whole archive's ratio
        ratio = total / max(archive.stat().st_size, 1)
        said = f"{where} unpacks to {ratio:,.0f} times its bytes ({_gb(total)} in {len(listed):,} members, the largest {largest.name!r})"
    else:
        worst = max(listed, key=lambda m: m.size / max(m.packed, 1))
        ratio = worst.size / max(worst.packed, 1)
        said = f"{where}: member {worst.name!r} unpacks to {ratio:,.0f} times its packed bytes ({_gb(worst.size)})"
    if ratio > MAX_RATIO:
        raise BadArchive(
            f"{said}, more than the {MAX_RATIO} any real dataset compresses by (a zip bomb?): unpack it yourself if "
            "you trust it and give the folder"
        )
    return total


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n:,} bytes"


def extract(archive: Path, out: Path, listed: list[Member], where: str) -> None:
    """The listed members written under `out` (regular files only, each its declared bytes)."""
    made: set[Path] = set()
    with _opened(archive, where) as a:
        for m in listed:
            dest = out / m.name  # a relative name without "..", and only regular files and folders made: inside `out`
            if dest.parent not in made:
                dest.parent.mkdir(parents=True, exist_ok=True)
                made.add(dest.parent)
            try:
                with _member(a, m) as src, dest.open("wb") as f:
                    _copy(src, f, m.size)
            except RuntimeError as e:  # zipfile: an encrypted member it could not tell from its flags
                raise BadArchive(f"{where}: member {m.name!r}: {e}") from None
            except UNREADABLE as e:
                if isinstance(e, OSError) and e.errno:  # the disk's (full, read-only), not the archive's
                    raise BadArchive(
                        f"{where}: member {m.name!r} could not be written to {out} ({e.strerror}): free some space "
                        "(or point TMPDIR at a larger disk), or unpack it yourself and give the folder"
                    ) from None
                raise BadArchive(
                    f"{where}: member {m.name!r} is not readable ({e}): the archive may be truncated or damaged; "
                    "download or make it again"
                ) from None


@contextlib.contextmanager
def _member(a: zipfile.ZipFile | tarfile.TarFile, m: Member) -> Iterator[IO[bytes]]:
    if isinstance(a, zipfile.ZipFile):
        assert isinstance(m.source, zipfile.ZipInfo)
        with a.open(m.source) as f:
            yield f
        return
    assert isinstance(m.source, tarfile.TarInfo)
    member = a.extractfile(m.source)
    assert member is not None  # a regular file
    with member:
        yield member


def _copy(src: IO[bytes], dst: IO[bytes], size: int) -> None:
    written = 0
    while chunk := src.read(COPY_BYTES):
        written += len(chunk)
        if written > size:  # never more than the header declared
            raise zipfile.BadZipFile(f"more bytes than its header's {size:,}")
        dst.write(chunk)


def wrapper(names: Iterable[str]) -> str:
    """The one folder wrapping every name (`images` of `images/cat/1.png`, ...), or ""."""
    tops = {n.split("/", 1)[0] if "/" in n else "" for n in names}
    return tops.pop() if len(tops) == 1 and "" not in tops else ""


def root_of(out: Path) -> Path:
    """The folder the archive holds: `out`, or the one folder wrapping all of it."""
    entries = list(out.iterdir())
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return out


def source_in(root: Path) -> Path:
    """The source an extracted archive holds: its one file when that is all it holds at its top
    (a table, an NPZ), else the folder (an image folder, a table's parts: read, or refused with
    what it holds, as any folder is)."""
    entries = list(root.iterdir())
    if len(entries) == 1 and entries[0].is_file():
        return entries[0]
    return root


@contextlib.contextmanager
def unpacked(archive: Path, where: str | None = None, max_bytes: int | None = None) -> Iterator[Path]:
    """The archive's source (`source_in`), extracted into a temporary folder that is removed
    afterwards. Inside the block, a dataset error or a notice naming the extracted files names
    them inside the archive instead (`images.zip/cat/1.png`)."""
    where = where or str(archive)
    listed = members(archive, where)
    with tempfile.TemporaryDirectory(prefix="smlt-archive-") as tmp:
        free = int(shutil.disk_usage(tmp).free * DISK_MARGIN)
        limit = min(MAX_UNPACKED_BYTES, free) if max_bytes is None else max_bytes
        advice = (
            f"{tmp.rsplit('/', 1)[0]} has {_gb(free)} free: free some space (or point TMPDIR at a larger disk), or "
            "unpack it yourself and give the folder"
            if limit == free
            else "unpack it yourself and give the folder"
        )
        check_sizes(archive, listed, where, limit, advice)
        extract(archive, Path(tmp), listed, where)
        with named_inside(tmp, where):
            yield source_in(root_of(Path(tmp)))


@contextlib.contextmanager
def named_inside(tmp: str, where: str) -> Iterator[None]:
    """Dataset errors and notices (smlt.notice, progress lines) that name a file under `tmp`
    name it inside the archive `where` instead."""

    def rename(text: str) -> str:
        return text.replace(tmp + "/", where.rstrip("/") + "/").replace(tmp, where)

    class Rename(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            said = record.getMessage()
            if tmp in said:
                record.msg, record.args = rename(said), ()
            return True

    loggers = [logging.getLogger("smlt.notice"), logging.getLogger("smlt.runtime.progress")]
    renaming = Rename()
    for logger in loggers:
        logger.addFilter(renaming)
    try:
        yield
    except InvalidDataset as e:
        message = rename(str(e))
        if message == str(e):
            raise
        raise type(e)(message) from None
    finally:
        for logger in loggers:
            logger.removeFilter(renaming)
