"""The command line: ``report`` and ``whatif``, embedded local Spark or under spark-submit.

    python -m roarmq.pipeline report --archive DIR --definitions FILE --out DIR [--master local[*]]
    python -m roarmq.pipeline whatif --archive DIR --definitions FILE --candidate FILE --out DIR

Everything that can be checked before Spark starts is (definitions, archive, window), and each
such problem is one line on stderr with exit code 2; a failed Spark job is one line with exit
code 1. The last line on stdout is a one-line summary.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .errors import PipelineError
from .session import LOG_LEVELS

PROG = "python -m roarmq.pipeline"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG, description="Analyse RoarMQ's traffic archive with Spark."
    )
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--archive", required=True, help="the broker's [archive] dir")
        sp.add_argument(
            "--definitions",
            required=True,
            help="definitions JSON (GET /api/definitions) describing the window",
        )
        sp.add_argument("--out", required=True, help="output directory (on the driver)")
        sp.add_argument(
            "--master",
            default=None,
            help="Spark master (default local[*]; under spark-submit: its own)",
        )
        sp.add_argument("--since", help="first hour to read, UTC (e.g. 2024-05-01T13)")
        sp.add_argument("--until", help="last hour to read, inclusive, UTC")
        sp.add_argument(
            "--log-level",
            default="warn",
            choices=LOG_LEVELS,
            help="Spark's log level (default warn: its INFO chatter stays off)",
        )
        sp.add_argument(
            "--conf",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="a Spark setting, e.g. spark.driver.memory=4g (repeatable)",
        )

    common(sub.add_parser("report", help="traffic, top keys, fan-out, unroutable, binding hits"))
    w = sub.add_parser("whatif", help="per-queue effect of candidate definitions")
    common(w)
    w.add_argument("--candidate", required=True, help="candidate definitions JSON")
    return p


def _warn(message: str) -> None:
    print(f"{PROG}: warning: {message}", file=sys.stderr, flush=True)


def _spark_error(exc: BaseException) -> str:
    """One line from a Spark/py4j failure: the innermost message, no stack trace."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):  # a Python worker traceback ends with "Type: message"
        if ": " in line and not line.startswith(("File ", "at ")):
            return line
    return lines[0] if lines else type(exc).__name__


def prepare(args: argparse.Namespace) -> dict[str, Any]:
    """All the checks that need no Spark; returns what the job needs."""
    from .definitions import load_definitions
    from .jobs import router_for
    from .reader import parse_hour, scan_archive

    since = parse_hour(args.since, "--since") if args.since else None
    until = parse_hour(args.until, "--until") if args.until else None
    if since and until and since > until:
        raise PipelineError(f"--since {since} is after --until {until}")
    current = load_definitions(args.definitions)
    router_for(current)  # builds the indexes: bad binding arguments are reported here
    candidate = None
    if args.command == "whatif":
        candidate = load_definitions(args.candidate)
        router_for(candidate)
    scan = scan_archive(args.archive, since, until)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PipelineError(f"--out {out}: exists and is not a directory")
    for path, why in scan.skipped:
        _warn(f"skipping {path}: {why}")
    if scan.journals:
        _warn(
            f"{len(scan.journals)} archive journals have not been rolled into data files, "
            "so their messages are not read (a running broker's open journals: "
            "`roarmq ctl archive_roll` closes them; a broker that stopped without closing its "
            f"archive replays them when it starts): {scan.journals[0]}"
        )
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise PipelineError(f"--conf {item!r}: expected KEY=VALUE")
        conf[key.strip()] = value
    return {"current": current, "candidate": candidate, "scan": scan, "out": out, "conf": conf}


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    job = prepare(args)
    from .session import get_spark

    spark, created = get_spark(args.master, conf=job["conf"], log_level=args.log_level)
    try:
        if args.command == "report":
            from .report import run_report

            summary = run_report(spark, job["scan"], job["current"], job["out"])
        else:
            from .whatif import run_whatif

            summary = run_whatif(spark, job["scan"], job["current"], job["candidate"], job["out"])
    finally:
        if created:
            spark.stop()
    if summary["rows_unknown_exchange"]:
        _warn(
            f"{summary['rows_unknown_exchange']:,} messages were published to exchanges the "
            f"definitions do not declare: {', '.join(summary['unknown_exchanges'][:5])}"
        )
    unread = summary["unreadable"]
    if unread or not summary["rows_read"]:
        # The driver listed files that the executors could not open: on a cluster, an
        # archive that only the driver's machine sees. A report of nothing is no answer.
        if unread:
            what = f"could not read {len(unread)} of {summary['files_read']} files ({unread[0]})"
        else:
            what = f"read no rows from {summary['files_read']} files under {job['scan'].root}"
        raise PipelineError(
            f"the executors {what}: --archive must be on storage every executor can read, "
            f"at the same path (see {summary['outputs'][-1]})"
        )
    if summary["rows_read"] != summary["rows_in_files"]:
        _warn(
            f"{summary['rows_in_files'] - summary['rows_read']:,} rows of the listed files "
            "were not read"
        )
    skipped = f", {len(summary['files_skipped'])} skipped" if summary["files_skipped"] else ""
    page = summary["outputs"][-1]
    tables = sum(1 for p in summary["outputs"] if p.endswith(".parquet"))
    print(
        f"{args.command}: read {summary['rows_read']:,} rows from {summary['files_read']} files"
        f"{skipped} ({summary['window']}), routed {summary['rows_routed']:,} rows in "
        f"{time.monotonic() - started:.1f} s; wrote {tables} tables to "
        f"{job['out']}/ and {page}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except PipelineError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if type(exc).__module__.startswith(("pyspark", "py4j")):
            print(f"{PROG}: error: Spark job failed: {_spark_error(exc)}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
