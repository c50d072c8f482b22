"""Errors the command reports before Spark starts: one line on stderr, exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from roarmq.broker.archive import Archive
from roarmq.broker.config import ArchiveConfig
from roarmq.broker.core.message import Message
from roarmq.pipeline.cli import main
from roarmq.pipeline.reader import check_file, scan_archive
from roarmq.protocol.frames import ContentHeader
from roarmq.protocol.properties import BasicProperties

REPO = Path(__file__).resolve().parents[2]

DEFS = {
    "vhosts": [{"name": "/"}],
    "exchanges": [{"name": "orders", "vhost": "/", "type": "topic", "arguments": {}}],
    "queues": [{"name": "q", "vhost": "/", "arguments": {}}],
    "bindings": [
        {
            "source": "orders",
            "vhost": "/",
            "destination": "q",
            "destination_type": "queue",
            "routing_key": "a.*",
            "arguments": {},
        }
    ],
}


@pytest.fixture
def archive(tmp_path) -> Path:
    root = tmp_path / "archive"
    a = Archive(ArchiveConfig(enabled=True, dir=str(root)))
    header = ContentHeader.from_properties(BasicProperties(), body_size=1)
    for _ in range(3):
        a.record("/", Message("orders", "a.b", header, b"x"), ())
    a.close()
    return root


def write(tmp_path: Path, name: str, content: str | dict) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
    return path


def run(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    err = capsys.readouterr().err
    return code, err


def report_args(archive: Path, defs: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "report",
        "--archive",
        str(archive),
        "--definitions",
        str(defs),
        "--out",
        str(tmp_path / "out"),
        *extra,
    ]


def assert_one_line(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("python -m roarmq.pipeline: error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_json_syntax_error_gives_line_and_column(tmp_path, archive, capsys):
    defs = write(tmp_path, "defs.json", '{"exchanges": [\n  {"name": "a",}\n]}')
    code, err = run(capsys, *report_args(archive, defs, tmp_path))
    assert_one_line(code, err, f"{defs}:2:16: invalid JSON")


@pytest.mark.parametrize(
    "mutate, where, message",
    [
        (lambda d: d["bindings"][0].pop("destination"), "bindings[0].destination", "missing"),
        (
            lambda d: d["bindings"][0].update(destination=7),
            "bindings[0].destination",
            "expected a string, got a number",
        ),
        (
            lambda d: d["bindings"][0].update(source="nope"),
            "bindings[0].source",
            "unknown exchange 'nope' in vhost '/'",
        ),
        (
            lambda d: d["bindings"][0].update(destination="missing"),
            "bindings[0].destination",
            "unknown queue 'missing'",
        ),
        (
            lambda d: d["bindings"][0].update(destination_type="topic"),
            "bindings[0].destination_type",
            'expected "queue" or "exchange"',
        ),
        (
            lambda d: d["exchanges"][0].update(type="x-no-such-type"),
            "exchanges[0].type",
            "unsupported exchange type",
        ),
        (lambda d: d.update(queues={}), "queues", "expected an array, got an object"),
        (
            lambda d: d["bindings"].append(
                {"source": "amq.headers", "destination": "q", "arguments": {"x-match": "most"}}
            ),
            "bindings[1].arguments",
            "Invalid x-match field value",
        ),
    ],
)
def test_structural_errors_name_the_key_and_line(tmp_path, archive, capsys, mutate, where, message):
    doc = json.loads(json.dumps(DEFS))
    mutate(doc)
    defs = write(tmp_path, "defs.json", doc)
    code, err = run(capsys, *report_args(archive, defs, tmp_path))
    assert_one_line(code, err, f": {where}: {message}")
    assert err.startswith(f"python -m roarmq.pipeline: error: {defs}:")
    line = int(err.split(f"{defs}:", 1)[1].split(":", 1)[0])  # the line the key is on
    assert line > 1


def test_unknown_exchange_in_the_candidate(tmp_path, archive, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    doc = json.loads(json.dumps(DEFS))
    doc["bindings"][0]["source"] = "gone"
    candidate = write(tmp_path, "candidate.json", doc)
    code, err = run(
        capsys,
        "whatif",
        "--archive",
        str(archive),
        "--definitions",
        str(defs),
        "--candidate",
        str(candidate),
        "--out",
        str(tmp_path / "out"),
    )
    assert_one_line(code, err, str(candidate), "bindings[0].source: unknown exchange 'gone'")


def test_missing_archive_directory(tmp_path, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    code, err = run(capsys, *report_args(tmp_path / "nowhere", defs, tmp_path))
    assert_one_line(code, err, "archive directory not found", str(tmp_path / "nowhere"))


def test_archive_without_partitions(tmp_path, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    (tmp_path / "empty").mkdir()
    code, err = run(capsys, *report_args(tmp_path / "empty", defs, tmp_path))
    assert_one_line(code, err, "no archive partitions under")


def test_empty_window(tmp_path, archive, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    code, err = run(capsys, *report_args(archive, defs, tmp_path, "--since", "2999-01-01T00"))
    assert_one_line(code, err, "empty window", "between 2999-01-01T00 and the end")


def test_bad_window_options(tmp_path, archive, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    code, err = run(capsys, *report_args(archive, defs, tmp_path, "--since", "yesterday"))
    assert_one_line(code, err, "--since: expected an hour like 2024-05-01T13")
    code, err = run(
        capsys,
        *report_args(archive, defs, tmp_path, "--since", "2024-05-02", "--until", "2024-05-01T23"),
    )
    assert_one_line(code, err, "--since 2024-05-02T00 is after --until 2024-05-01T23")


def test_missing_definitions_file(tmp_path, archive, capsys):
    code, err = run(capsys, *report_args(archive, tmp_path / "none.json", tmp_path))
    assert_one_line(code, err, "none.json: definitions file not found")


def test_torn_and_foreign_files_are_set_aside(tmp_path, archive):
    directory = next(archive.glob("vhost=*/hour=*"))
    good = next(directory.glob("part-*.parquet"))
    torn = directory / "part-20990101T000000-abcdef-00000001.parquet"
    torn.write_bytes(good.read_bytes()[:-20])
    foreign = directory / "part-20990101T000000-abcdef-00000002.parquet"
    pq.write_table(pa.table({"x": [1]}), foreign)
    assert check_file(good) == ([3], None)
    assert check_file(torn)[1].startswith("torn")
    assert check_file(foreign)[1] == "not an archive file: no column 'ts'"
    scan = scan_archive(archive)
    assert scan.files == [good] and scan.rows == 3
    assert [p for p, _ in scan.skipped] == [torn, foreign]


def test_a_real_process_exits_2_with_one_line(tmp_path, archive):
    defs = write(tmp_path, "defs.json", '{"bindings": [}')
    proc = subprocess.run(
        [sys.executable, "-m", "roarmq.pipeline", *report_args(archive, defs, tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"python -m roarmq.pipeline: error: {defs}:1:15: invalid JSON: Expecting value"
    ]
    assert proc.stdout == ""


def test_bad_conf_option(tmp_path, archive, capsys):
    defs = write(tmp_path, "defs.json", DEFS)
    code, err = run(capsys, *report_args(archive, defs, tmp_path, "--conf", "spark.x"))
    assert_one_line(code, err, "--conf 'spark.x': expected KEY=VALUE")


def test_unconverted_journals_are_listed(tmp_path, archive):
    directory = next(archive.glob("vhost=*/hour=*"))
    journal = directory / ".part-20990101T000000-abcdef-00000001.journal"
    journal.write_bytes(b"")  # what a broker that died mid-partition leaves
    scan = scan_archive(archive)
    assert scan.journals == [journal] and scan.rows == 3


def test_log_level_controls_sparks_chatter():
    from roarmq.pipeline.session import log4j2_properties

    quiet = log4j2_properties()
    assert "rootLogger.level = warn" in quiet
    assert "org.apache.spark.scheduler.DAGScheduler" in quiet  # one-line failures instead
    chatty = log4j2_properties("info")
    assert "rootLogger.level = info" in chatty and "DAGScheduler" not in chatty
    code = subprocess.run(
        [sys.executable, "-m", "roarmq.pipeline", "report", "--log-level", "loud"]
        + ["--archive", "a", "--definitions", "d", "--out", "o"],
        capture_output=True,
        text=True,
    )
    assert code.returncode == 2 and "--log-level: invalid choice: 'loud'" in code.stderr
