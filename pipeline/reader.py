"""Finding the archive files of a time window, and setting aside the ones that cannot be read.

Runs on the driver before Spark starts, so a missing directory or an empty window is a one-line
error rather than a failed job. Every candidate file's Parquet footer is read (cheap: the tail
of the file): a torn file (a crash mid-write with a non-atomic copy, a truncated transfer) has
no valid footer, and a file from elsewhere lacks the archive's columns; both are skipped with a
warning. Journals (hidden; the broker replays them into data files when it next starts) are
listed so the command can say that some traffic is not readable yet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from roarmq.broker.archive import (
    ENVELOPE_COLUMNS,
    SCHEMA,
    TRAFFIC_COLUMNS,
    live_files,
    partitions,
    pending_journals,
)

from .errors import PipelineError

#: Columns the pipeline relies on, in the archive's order (the time and the vhost, which the
#: partition also gives, then what jobs.py reads); a file without them (with these types) is
#: not an archive file.
REQUIRED = tuple(
    name for name in SCHEMA.names if name in {"ts", "vhost", *ENVELOPE_COLUMNS, *TRAFFIC_COLUMNS}
)

_HOUR = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:[T ](\d{2})(?::\d{2}(?::\d{2})?)?)?Z?$")


def parse_hour(text: str, option: str) -> str:
    """``2024-05-01T13``, ``2024-05-01T13:00``, ``2024-05-01 13`` or ``2024-05-01`` -> hour."""
    m = _HOUR.match(text.strip())
    if m is None:
        raise PipelineError(f"{option}: expected an hour like 2024-05-01T13 (UTC), got {text!r}")
    return f"{m.group(1)}T{m.group(2) or '00'}"


@dataclass
class ArchiveScan:
    root: Path
    files: list[Path] = field(default_factory=list)
    row_groups: dict[Path, list[int]] = field(default_factory=dict)  # rows of each row group
    #: each file's partition, ``(vhost, hour)``: the broker splits what it archives by the vhost
    #: and the hour of each message's timestamp, so these hold for every row of the file
    partition: dict[Path, tuple[str, str]] = field(default_factory=dict)
    rows: int = 0  # by the footers
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    journals: list[Path] = field(default_factory=list)  # not yet rolled into data files
    hours: list[str] = field(default_factory=list)
    vhosts: set[str] = field(default_factory=set)

    @property
    def window(self) -> str:
        if not self.hours:
            return "-"
        return (
            self.hours[0]
            if self.hours[0] == self.hours[-1]
            else f"{self.hours[0]}..{self.hours[-1]}"
        )


def check_file(path: Path) -> tuple[list[int], str | None]:
    """``(rows of each row group, None)`` for a readable archive file, else ``([], why not)``."""
    try:
        size = path.stat().st_size
        if size < 12:
            return [], f"torn: {size} bytes, too short for Parquet"
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(-4, 2)
            tail = f.read(4)
        if head != b"PAR1" or tail != b"PAR1":
            return [], "torn: no Parquet footer (PAR1 magic missing)"
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except OSError as exc:
        return [], f"unreadable: {exc.strerror or exc}"
    except (pa.ArrowException, ValueError) as exc:
        return [], f"corrupt footer: {str(exc).splitlines()[0]}"
    for name in REQUIRED:
        i = schema.get_field_index(name)
        if i < 0:
            return [], f"not an archive file: no column {name!r}"
        if schema.field(i).type != SCHEMA.field(name).type:
            return [], (
                f"not an archive file: column {name!r} is {schema.field(i).type}, "
                f"expected {SCHEMA.field(name).type}"
            )
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)], None


def scan_archive(
    root: str | Path, since: str | None = None, until: str | None = None
) -> ArchiveScan:
    """The readable files of hours ``since``..``until`` (inclusive, UTC) under ``root``.

    Paths are made absolute here, on the driver: executors on a cluster run in working
    directories of their own, where a relative path names nothing.
    """
    root = Path(root).resolve()
    if not root.exists():
        raise PipelineError(f"archive directory not found: {root}")
    if not root.is_dir():
        raise PipelineError(f"archive path is not a directory: {root}")
    scan = ArchiveScan(root)
    found_any = False
    hours = set()
    outside: list[str] = []  # the hour of each data file outside the window
    for vhost, hour, directory in partitions(root):
        found_any = True
        if (since and hour < since) or (until and hour > until):
            outside += [hour] * len(live_files(directory))
            continue
        scan.journals += pending_journals(directory)
        for path in live_files(directory):
            groups, problem = check_file(path)
            if problem is not None:
                scan.skipped.append((path, problem))
                continue
            rows = sum(groups)
            scan.files.append(path)
            scan.row_groups[path] = groups
            scan.partition[path] = (vhost, hour)
            scan.rows += rows
            if rows:
                hours.add(hour)
                scan.vhosts.add(vhost)
    scan.hours = sorted(hours)
    if not found_any:
        raise PipelineError(
            f"no archive partitions under {root} "
            "(expected vhost=*/hour=*/part-*.parquet; is [archive] enabled?)"
        )
    if scan.rows == 0:
        window = (
            f" between {since or 'the start'} and {until or 'the end'}" if since or until else ""
        )
        raise PipelineError(
            f"empty window: no archived messages in {root}{window}: {why_empty(scan, outside)}"
        )
    return scan


def why_empty(scan: ArchiveScan, outside: list[str]) -> str:
    """What an empty window holds instead, and why none of it was read: open journals (the
    usual case while a broker runs), unreadable or empty files, files outside the window."""
    reasons = []
    if scan.journals:
        reasons.append(
            f"{len(scan.journals)} journals still open (a broker writes Parquet when a journal "
            "rolls: at the hour, every [archive] roll_minutes, at shutdown) - run "
            "`roarmq ctl archive_roll` to close them now"
        )
    if scan.skipped:
        path, problem = scan.skipped[0]
        reasons.append(f"{len(scan.skipped)} unreadable files skipped ({path.name}: {problem})")
    if scan.files:
        reasons.append(f"{len(scan.files)} Parquet files with no rows")
    if outside:
        first, last = min(outside), max(outside)
        span = first if first == last else f"{first}..{last}"
        reasons.append(f"{len(outside)} Parquet files outside the window (hours {span})")
    return "; ".join(reasons) or "no Parquet files or journals in it"
