"""What one record's fdatasync costs on this disk: appended, or into space allocated before.

    python bench/fsync.py [--dir DIR] [--ops 1000] [--rounds 8] [--size 163] [--fifo]
                          [--json bench/results/fsync.json]

Each op is what the segment log's writer does for a publisher waiting for each confirm:
``pwrite`` of one batch of ``size`` bytes (a publish record and the ack and delivered
records of the message before it: 163 bytes in persistent-w1) after the previous one,
then ``fdatasync``. Modes, each in a new file:

* append: the file grows with every op (what the log did before `preallocate`);
* fallocated: ``posix_fallocate`` of the whole range first (what it does now);
* zero-filled: the range written with zeros and fsynced first;
* dsync: appending, the file opened ``O_DSYNC`` (no fdatasync call; the kernel's own).

Reported per mode: the median over the rounds of each round's p50 and p90 op time, and
system CPU µs per op (``getrusage``). Modes alternate within a round, so each sees the
same machine. ``--fifo`` runs under SCHED_FIFO (root): on a busy 2-core machine an op
otherwise waits up to a scheduler tick (4 ms here) to run again after its I/O completes.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from lib import RESULTS
from lib.machine import machine_info
from lib.output import markdown_table, settings_of, write_json

MODES = ("append", "fallocated", "zero-filled", "dsync")


def one_round(directory: str, mode: str, ops: int, size: int) -> tuple[list[float], float]:
    """Op times (s) and system CPU seconds of `ops` pwrite + fdatasync in a new file."""
    path = os.path.join(directory, f"fsync-{mode}")
    span = ops * size
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "fallocated":
            os.posix_fallocate(fd, 0, span)
        elif mode == "zero-filled":
            os.pwrite(fd, bytes(span), 0)
        os.fsync(fd)
        if mode == "dsync":
            os.close(fd)
            fd = os.open(path, os.O_RDWR | os.O_DSYNC)
        record = b"r" * size
        sync = mode != "dsync"
        times = []
        before = resource.getrusage(resource.RUSAGE_SELF).ru_stime
        for i in range(ops):
            started = time.perf_counter()
            os.pwrite(fd, record, i * size)
            if sync:
                os.fdatasync(fd)
            times.append(time.perf_counter() - started)
        return times, resource.getrusage(resource.RUSAGE_SELF).ru_stime - before
    finally:
        os.close(fd)
        os.unlink(path)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    p.add_argument("--ops", type=int, default=1000, help="pwrite + fdatasync per round and mode")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--size", type=int, default=163, help="bytes a write")
    p.add_argument("--fifo", action="store_true", help="run under SCHED_FIFO (root)")
    p.add_argument("--json", type=Path, default=RESULTS / "fsync.json")
    args = p.parse_args()
    if args.fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))
    per_mode: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        for _ in range(args.rounds):
            for mode in MODES:
                times, sys_s = one_round(directory, mode, args.ops, args.size)
                per_mode[mode].append((quantile(times, 0.5), quantile(times, 0.9), sys_s))
    rows = []
    for mode, runs in per_mode.items():
        rows.append(
            {
                "mode": mode,
                "p50_us": statistics.median(r[0] for r in runs) * 1e6,
                "p90_us": statistics.median(r[1] for r in runs) * 1e6,
                "sys_us_per_op": statistics.median(r[2] for r in runs) / args.ops * 1e6,
            }
        )
    print(f"fsync: {args.ops} x {args.size} B a round, {args.rounds} rounds, fifo={args.fifo}")
    keys = ("p50_us", "p90_us", "sys_us_per_op")
    cells = [[r["mode"], *(f"{r[k]:.0f}" for k in keys)] for r in rows]
    print(markdown_table(["mode", "p50 µs", "p90 µs", "system CPU µs/op"], cells, align="lrrr"))
    out = {"benchmark": "fsync", "command": sys.argv, "machine": machine_info(), "rows": rows}
    write_json(args.json, {**out, "settings": settings_of(args)})
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
