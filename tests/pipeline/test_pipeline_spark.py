"""The pipeline end to end on Spark local mode: a broker records traffic, report and whatif
read it, and every count equals a pure-Python computation over the same archive.

One SparkSession for the whole module (local[2], no UI, 2 shuffle partitions); the broker run
happens once per module. The command line runs in-process and reuses the session.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import aio_pika
import pyarrow.parquet as pq
import pytest
from machine import missing
from support import pipeline_reference as ref
from support.waiting import free_port

from roarmq.broker.management import export_definitions
from roarmq.broker.ops.clock import VirtualClock
from roarmq.broker.testing import ephemeral_config, running_broker
from roarmq.pipeline.cli import main

# slow (Spark): `make check` leaves it out
# One worker runs the module (`make test` runs pytest-xdist with --dist loadgroup): its
# Spark session and module fixtures are built once, not once in each worker.
pytestmark = [pytest.mark.timeout(300), pytest.mark.slow, pytest.mark.xdist_group("spark")]

REPO = Path(__file__).resolve().parents[2]
HOURS = 3
START = 1_717_200_000.0  # 2024-06-01T00:00:00Z


@pytest.fixture(scope="session")
def spark():
    from roarmq.pipeline.session import get_spark

    session, _ = get_spark("local[2]", conf={"spark.sql.shuffle.partitions": "2"})
    yield session
    session.stop()


async def _topology(conn: aio_pika.abc.AbstractConnection) -> dict:
    ch = await conn.channel()
    names = [
        "q.created",
        "q.all",
        "q.eu",
        "q.never",
        "q.audit",
        "q.k1",
        "q.k2",
        "q.alt",
        "q.ha",
        "q.hany",
        "q.hp",
        "q.default",
    ]
    q = {n: await ch.declare_queue(n) for n in names}
    orders = await ch.declare_exchange("orders", "topic")
    events = await ch.declare_exchange("events", "fanout")
    alt = await ch.declare_exchange("alt", "fanout")
    main_x = await ch.declare_exchange("main", "direct", arguments={"alternate-exchange": "alt"})
    hdr = await ch.declare_exchange("hdr", "headers")
    await q["q.created"].bind(orders, "order.*.created")
    await q["q.all"].bind(orders, "order.#")
    await q["q.eu"].bind(orders, "*.eu.#")
    await q["q.never"].bind(orders, "never.matches")
    await q["q.audit"].bind(events, "")
    await orders.bind(events, "")
    await hdr.bind(events, "")
    await q["q.k1"].bind(main_x, "k1")
    await q["q.k2"].bind(main_x, "k2")
    await q["q.alt"].bind(alt, "")
    await q["q.ha"].bind(hdr, "", arguments={"x-match": "all", "type": "a", "v": 1})
    await q["q.hany"].bind(hdr, "", arguments={"x-match": "any", "region": "eu", "prio": 5})
    await q["q.hp"].bind(hdr, "", arguments={"x-match": "any", "present": None})
    amq = await ch.get_exchange("amq.topic", ensure=False)
    return {"ch": ch, "orders": orders, "events": events, "main": main_x, "hdr": hdr, "amq": amq}


async def _publish_hour(t: dict, ch2: aio_pika.abc.AbstractChannel, d2, hour: int) -> None:
    msg = aio_pika.Message
    order_keys = [
        "order.us.created",
        "order.eu.created",
        "order.eu.cancelled",
        "misc.eu",
        "nothing",
    ]
    for i in range(30 + 10 * hour):
        await t["orders"].publish(
            msg(b"o" * (i % 7), headers={"trace": i}),
            routing_key=order_keys[i % len(order_keys)],
            mandatory=False,
        )
        event_headers = [
            {"type": "a", "v": 1},
            {"region": "eu", "trace": i},
            None,
            {"prio": 5, "present": "yes"},
        ][i % 4]
        await t["events"].publish(
            msg(b"e", headers=event_headers),
            routing_key=["order.eu.x", "evt"][i % 2],
            mandatory=False,
        )
        main_cases = [
            ("k1", None),
            ("k2", None),
            ("k3", None),
            ("k1", {"CC": ["k2"], "BCC": ["k9"]}),
            ("zz", {"CC": ["k1"]}),
        ]
        key, headers = main_cases[i % len(main_cases)]
        await t["main"].publish(msg(b"m" * 3, headers=headers), routing_key=key, mandatory=False)
        hdr_headers = [
            {"type": "a", "v": 1},
            {"type": "a", "v": 2},
            {"region": "eu"},
            {"present": 1, "trace": i},
            {},
        ][i % 5]
        await t["hdr"].publish(msg(b"h", headers=hdr_headers), routing_key="", mandatory=False)
        if i % 3 == 0:
            await t["ch"].default_exchange.publish(
                msg(b"d"), routing_key="q.default", mandatory=False
            )
            await t["ch"].default_exchange.publish(
                msg(b"d"), routing_key="missing.queue", mandatory=False
            )
            await t["amq"].publish(msg(b"a"), routing_key="unbound", mandatory=False)
        if i % 2 == 0:
            await d2.publish(msg(b"v2"), routing_key=["x", "y"][(i // 2) % 2], mandatory=False)
            # The same exchange name and keys as in "/", routed by v2's own bindings.
            await t["main.v2"].publish(msg(b"v2"), routing_key=key, mandatory=False)


async def _record(root: Path) -> None:
    clock = VirtualClock(wall_start=START)
    cfg = ephemeral_config(
        data_dir=str(root / "data"),
        archive={
            "enabled": True,
            "dir": str(root / "archive"),
            "batch_rows": 64,
            "max_pending_batches": 1000,
        },
    )
    async with running_broker(cfg, clock=clock) as b:
        b.broker.add_vhost("v2")
        b.broker.set_permission("guest", "v2", ".*", ".*", ".*")
        conn = await aio_pika.connect(b.url + "/?heartbeat=0")
        conn2 = await aio_pika.connect(b.url + "/v2?heartbeat=0")
        t = await _topology(conn)
        ch2 = await conn2.channel()
        d2 = await ch2.declare_exchange("d2", "direct")
        q2 = await ch2.declare_queue("q2")
        await q2.bind(d2, "x")
        t["main.v2"] = await ch2.declare_exchange("main", "direct")
        await q2.bind(t["main.v2"], "k2")
        for hour in range(HOURS):
            await _publish_hour(t, ch2, d2, hour)
            clock.advance(3600)
        await conn.close()
        await conn2.close()
        (root / "current.json").write_text(json.dumps(export_definitions(b.broker), indent=1))


def _candidate(current: dict) -> dict:
    doc = json.loads(json.dumps(current))
    doc["queues"].append(
        {"name": "q.new", "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
    )
    bindings = [
        b
        for b in doc["bindings"]
        if not (b["routing_key"] == "order.#" or b["arguments"].get("region") == "eu")
    ]
    bindings += [
        {
            "source": "orders",
            "vhost": "/",
            "destination": "q.created",
            "destination_type": "queue",
            "routing_key": "order.*.cancelled",
            "arguments": {},
        },
        {
            "source": "orders",
            "vhost": "/",
            "destination": "q.new",
            "destination_type": "queue",
            "routing_key": "*.us.#",
            "arguments": {},
        },
        {
            "source": "hdr",
            "vhost": "/",
            "destination": "q.hany",
            "destination_type": "queue",
            "routing_key": "",
            "arguments": {"x-match": "all", "region": "eu"},
        },
    ]
    doc["bindings"] = bindings
    return doc


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("recorded")
    asyncio.run(_record(root))
    current = json.loads((root / "current.json").read_text())
    (root / "candidate.json").write_text(json.dumps(_candidate(current), indent=1))
    return root


def _rows(path: Path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def test_broker_records_what_it_routed(recorded):
    """Every archived row's queues are what the naive router says the definitions give."""
    rows = ref.read_rows(recorded / "archive")
    router = ref.NaiveRouter(recorded / "current.json")
    assert {r["vhost"] for r in rows} == {"/", "v2"}
    assert len({r["hour"] for r in rows}) == HOURS
    for row in rows:
        queues, _ = router.route(
            row["vhost"], row["exchange"], row["routing_key"], ref.headers_of(row)
        )
        assert sorted(queues) == row["queues"], row
        assert row["unroutable"] == (not queues)
        assert row["queue_count"] == len(queues)
    assert any(r["headers"] and b"CC" in r["headers"] for r in rows)
    assert any(r["unroutable"] for r in rows)


def test_report_equals_reference(spark, recorded, tmp_path, capsys):
    out = tmp_path / "report"
    code = main(
        [
            "report",
            "--archive",
            str(recorded / "archive"),
            "--definitions",
            str(recorded / "current.json"),
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("report: read ")
    rows = ref.read_rows(recorded / "archive")
    expected = ref.report(rows, ref.NaiveRouter(recorded / "current.json"))

    traffic = {
        (r["vhost"], r["exchange"], r["routing_key"], r["hour"]): (
            r["messages"],
            r["bytes"],
            r["unroutable"],
            r["deliveries"],
        )
        for r in _rows(out / "traffic.parquet")
    }
    assert traffic == expected["traffic"]
    fanout = {(r["vhost"], r["queues"]): r["messages"] for r in _rows(out / "fanout.parquet")}
    assert fanout == expected["fanout"]
    queues = {(r["vhost"], r["queue"]): r["messages"] for r in _rows(out / "queues.parquet")}
    assert queues == expected["queues"]
    bindings = {
        (
            r["vhost"],
            r["source"],
            r["destination_type"],
            r["destination"],
            r["routing_key"],
            r["arguments"],
        ): r["hits"]
        for r in _rows(out / "bindings.parquet")
    }
    assert bindings == expected["bindings"]
    assert bindings[("/", "orders", "queue", "q.never", "never.matches", "{}")] == 0

    hourly = {(r["vhost"], r["hour"]): r["messages"] for r in _rows(out / "hourly.parquet")}
    per_hour = {}
    for (vhost, _, _, hour), (n, *_rest) in expected["traffic"].items():
        per_hour[(vhost, hour)] = per_hour.get((vhost, hour), 0) + n
    assert hourly == per_hour
    exchanges = {
        (r["vhost"], r["exchange"]): (r["messages"], r["unroutable"])
        for r in _rows(out / "exchanges.parquet")
    }
    per_exchange = {}
    for (vhost, exchange, _, _), (n, _, unroutable, _) in expected["traffic"].items():
        m, u = per_exchange.get((vhost, exchange), (0, 0))
        per_exchange[(vhost, exchange)] = (m + n, u + unroutable)
    assert exchanges == per_exchange
    top = [r for r in _rows(out / "top_keys.parquet") if r["vhost"] == "/"]
    assert [r["rank"] for r in top] == list(range(1, len(top) + 1))
    assert [r["messages"] for r in top] == sorted((r["messages"] for r in top), reverse=True)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["rows_read"] == summary["rows_in_files"] == len(rows)
    assert summary["rows_routed"] == len(rows)
    assert summary["agree_rate"] == 1.0
    assert summary["unroutable"] == sum(r["unroutable"] for r in rows)
    assert summary["bindings_never_matched"] == 1
    workers = summary["seconds"]["workers"]  # where the time went, for bench/pipeline_scale.py
    assert set(workers) == {"setup", "read", "group", "traffic", "route"}
    assert all(seconds > 0 for seconds in workers.values())
    assert summary["seconds"]["analyse"] > 0 and summary["seconds"]["output"] > 0
    page = (out / "report.html").read_text()
    for chart in ("hourly.png", "top_keys.png", "fanout.png", "unroutable.png", "bindings.png"):
        assert f"charts/{chart}" in page
        assert (out / "charts" / chart).read_bytes().startswith(b"\x89PNG")


def test_whatif_equals_reference(spark, recorded, tmp_path, capsys):
    out = tmp_path / "whatif"
    code = main(
        [
            "whatif",
            "--archive",
            str(recorded / "archive"),
            "--definitions",
            str(recorded / "current.json"),
            "--candidate",
            str(recorded / "candidate.json"),
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = ref.read_rows(recorded / "archive")
    expected = ref.whatif(
        rows,
        ref.NaiveRouter(recorded / "current.json"),
        ref.NaiveRouter(recorded / "candidate.json"),
    )
    got = {}
    for r in _rows(out / "queues.parquet"):
        counts = {k: r[k] for k in ("actual", "current", "added", "lost", "unchanged") if r[k]}
        assert r["candidate"] == r["added"] + r["unchanged"]
        assert r["actual"] == r["lost"] + r["unchanged"]
        if counts:
            got[(r["vhost"], r["queue"])] = counts
    assert got == expected["queues"]
    assert got[("/", "q.new")]["added"] > 0
    assert got[("/", "q.all")]["lost"] == got[("/", "q.all")]["actual"]
    bindings = {
        (
            r["vhost"],
            r["source"],
            r["destination_type"],
            r["destination"],
            r["routing_key"],
            r["arguments"],
        ): {k: r[k] for k in ("in_current", "in_candidate", "hits_current", "hits_candidate")}
        for r in _rows(out / "bindings.parquet")
    }
    assert bindings == expected["bindings"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["current_agree_rate"] == 1.0
    assert summary["messages_changed"] > 0
    assert (out / "whatif.html").exists()
    assert (out / "charts" / "queues.png").exists()


def test_torn_and_corrupt_files_are_skipped_and_reported(spark, recorded, tmp_path, capsys):
    archive = tmp_path / "archive"
    shutil.copytree(recorded / "archive", archive)
    files = sorted(archive.glob("vhost=%2F/hour=*/part-*.parquet"))
    victim = files[0]
    data = victim.read_bytes()
    torn = victim.parent / "part-99990101T000000-abcdef-00000001.parquet"
    torn.write_bytes(data[: len(data) // 2])  # a copy cut off mid-write
    garbage = files[-1].parent / "part-99990101T000000-abcdef-00000002.parquet"
    garbage.write_bytes(b"PAR1" + b"\x00" * 64 + b"PAR1")  # magic, but no valid footer
    out = tmp_path / "report"
    code = main(
        [
            "report",
            "--archive",
            str(archive),
            "--definitions",
            str(recorded / "current.json"),
            "--out",
            str(out),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    warnings = [line for line in captured.err.splitlines() if "skipping" in line]
    assert len(warnings) == 2
    assert any(str(torn) in w and "torn" in w for w in warnings)
    assert any(str(garbage) in w for w in warnings)
    summary = json.loads((out / "summary.json").read_text())
    assert {s["path"] for s in summary["files_skipped"]} == {str(torn), str(garbage)}
    expected = ref.report(
        ref.read_rows(archive, skip={torn, garbage}), ref.NaiveRouter(recorded / "current.json")
    )
    traffic = {
        (r["vhost"], r["exchange"], r["routing_key"], r["hour"]): (
            r["messages"],
            r["bytes"],
            r["unroutable"],
            r["deliveries"],
        )
        for r in _rows(out / "traffic.parquet")
    }
    assert traffic == expected["traffic"]
    assert "Skipped files" in (out / "report.html").read_text()


def test_window_filters_hours(spark, recorded, tmp_path, capsys):
    hours = sorted({r["hour"] for r in ref.read_rows(recorded / "archive")})
    out = tmp_path / "report"
    code = main(
        [
            "report",
            "--archive",
            str(recorded / "archive"),
            "--definitions",
            str(recorded / "current.json"),
            "--out",
            str(out),
            "--since",
            hours[1],
            "--until",
            hours[1],
        ]
    )
    assert code == 0, capsys.readouterr().err
    assert {r["hour"] for r in _rows(out / "traffic.parquet")} == {hours[1]}
    rows = [r for r in ref.read_rows(recorded / "archive") if r["hour"] == hours[1]]
    assert json.loads((out / "summary.json").read_text())["rows_read"] == len(rows)


def test_files_the_executors_cannot_read_fail_the_run(
    spark, recorded, tmp_path, capsys, monkeypatch
):
    """What a cluster does with an archive only the driver sees: the driver lists the files,
    the executors cannot open them. One line, exit code 2, and the page lists the files."""
    import roarmq.pipeline.cli as cli

    archive = tmp_path / "archive"
    shutil.copytree(recorded / "archive", archive)
    listed = cli.prepare

    def prepare_then_lose_files(args):
        job = listed(args)
        for path in job["scan"].files[:2]:
            path.unlink()  # gone between the driver's listing and the executors' reads
        return job

    monkeypatch.setattr(cli, "prepare", prepare_then_lose_files)
    out = tmp_path / "report"
    monkeypatch.chdir(tmp_path)
    code = main(
        ["report", "--archive", "archive", "--definitions", str(recorded / "current.json")]
        + ["--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "could not read 2 of" in err[0], err
    assert str(archive) in err[0]  # the relative --archive was resolved on the driver
    assert "Files the executors could not read" in (out / "report.html").read_text()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """A Spark standalone master and one worker from the installed pyspark, on loopback
    (the PyPI pyspark has no start-master.sh: `spark-class` runs the two daemons)."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request

    if shutil.which("java") is None:
        missing(
            "no Java runtime: Spark's standalone daemons need one (make test installs it)",
            "ROARMQ_EXPECT_PACKAGES",
        )
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    work = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(work / "w")}
    env["SPARK_HOME"] = str(spark_class.parent.parent)
    port, ui, worker_ui = free_port(), free_port(), free_port()
    master = subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
        + ["--port", str(port), "--webui-port", str(ui)],
        env=env,
        stdout=open(work / "master.log", "wb"),  # noqa: SIM115 - closed with the process
        stderr=subprocess.STDOUT,
    )
    url = f"spark://127.0.0.1:{port}"
    worker = subprocess.Popen(
        [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1"]
        + ["--cores", "2", "--memory", "2g", "--webui-port", str(worker_ui)],
        env=env,
        stdout=open(work / "worker.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as r:
                    if json.loads(r.read())["aliveworkers"] >= 1:
                        break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(
                "the standalone master and worker did not come up:\n"
                + (work / "master.log").read_text()[-2000:]
            )
        # The executors' Python: this venv's, with RoarMQ's installation hidden, so that the
        # job can only work if the command ships RoarMQ's code to them itself.
        hide = work / "hide"
        hide.mkdir()
        (hide / "sitecustomize.py").write_text(
            "import sys\n"
            "sys.meta_path[:] = [f for f in sys.meta_path\n"
            "                    if '__editable__' not in getattr(f, '__module__', '')]\n"
            "sys.path_hooks[:] = [h for h in sys.path_hooks\n"
            "                     if '__editable__' not in getattr(h, '__module__', '')]\n"
            f"sys.path[:] = [p for p in sys.path if p.rstrip('/') != {str(REPO)!r}]\n"
        )
        python = work / "executor-python"
        python.write_text(f'#!/bin/sh\nPYTHONPATH={hide} exec {sys.executable} "$@"\n')
        python.chmod(0o755)
        yield url, str(python)
    finally:
        for proc in (worker, master):
            proc.terminate()
        for proc in (worker, master):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_cluster_mode_ships_its_code_and_equals_local(spark, recorded, standalone, tmp_path):
    """`--master spark://…` on a standalone cluster whose executors do not have RoarMQ: the
    command ships its own code, and both jobs write what local mode writes."""
    import os
    import subprocess
    import sys

    url, python = standalone
    env = {**os.environ, "PYSPARK_PYTHON": python, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYTHONPATH", None)
    for command in ("report", "whatif"):
        extra = ["--candidate", str(recorded / "candidate.json")] if command == "whatif" else []
        args = [command, "--archive", str(recorded / "archive")]
        args += ["--definitions", str(recorded / "current.json"), *extra]
        local_out, cluster_out = tmp_path / f"{command}-local", tmp_path / f"{command}-cluster"
        assert main([*args, "--out", str(local_out)]) == 0
        proc = subprocess.run(
            [sys.executable, "-m", "roarmq.pipeline", *args, "--out", str(cluster_out)]
            + ["--master", url, "--conf", "spark.sql.shuffle.partitions=2"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"executors run {python}" in proc.stderr
        assert "ModuleNotFoundError" not in proc.stderr
        assert " INFO " not in proc.stderr  # Spark's chatter is off unless --log-level info
        for table in sorted(local_out.glob("*.parquet")):
            if table.is_dir():  # written by the executors: row order is theirs
                continue
            key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
            local_rows = sorted(_rows(table), key=key)
            assert sorted(_rows(cluster_out / table.name), key=key) == local_rows, table.name
        if command == "report":
            key = lambda r: json.dumps(r, sort_keys=True, default=str)  # noqa: E731
            assert sorted(_rows(cluster_out / "traffic.parquet"), key=key) == sorted(
                _rows(local_out / "traffic.parquet"), key=key
            )
        local = json.loads((local_out / "summary.json").read_text())
        remote = json.loads((cluster_out / "summary.json").read_text())
        for field in ("rows_read", "rows_routed", "agree_rate", "unreadable"):
            if field in local:
                assert remote[field] == local[field], field
