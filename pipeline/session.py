"""Getting a SparkSession: embedded local mode by default, or whatever spark-submit set up.

Local mode runs the executors' Python workers with this interpreter (``PYSPARK_PYTHON``), keeps
every socket on the loopback interface, and points log4j at a configuration that prints WARN and
above without Java stack traces (task failures reach the user as one line from the command, see
``pipeline.cli``). Spark's console progress bar stays on.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# Loggers that repeat at WARN/ERROR what the command reports itself in one line (task failures
# with their stack traces), or that only comment on the local machine.
_QUIET = {
    "org.apache.spark.executor.Executor": "off",
    "org.apache.spark.scheduler.TaskSetManager": "off",
    "org.apache.spark.scheduler.TaskSchedulerImpl": "off",
    "org.apache.spark.scheduler.DAGScheduler": "off",
    "org.apache.spark.api.python.PythonRunner": "off",
    "org.apache.spark.sql.execution.python": "off",
    "org.apache.spark.util.Utils": "error",
    "org.apache.hadoop.util.NativeCodeLoader": "error",
    "org.apache.spark.sql.execution.datasources.FileScanRDD": "error",
    "org.apache.spark.storage.BlockManager": "error",
    "org.apache.parquet": "error",
}


#: --log-level choices; "warn" (the default) keeps Spark's INFO chatter off.
LOG_LEVELS = ("error", "warn", "info", "debug")


def log4j2_properties(level: str = "warn") -> str:
    lines = [
        "status = error",
        f"rootLogger.level = {level}",
        "rootLogger.appenderRef.console.ref = console",
        "appender.console.type = Console",
        "appender.console.name = console",
        "appender.console.target = SYSTEM_ERR",
        "appender.console.layout.type = PatternLayout",
        "appender.console.layout.alwaysWriteExceptions = false",
        "appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n",
    ]
    quiet = _QUIET if level in ("error", "warn") else {}  # asked for more: all of it
    for i, (name, quiet_level) in enumerate(sorted(quiet.items())):
        lines += [f"logger.q{i}.name = {name}", f"logger.q{i}.level = {quiet_level}"]
    return "\n".join(lines) + "\n"


def under_spark_submit() -> bool:
    """True when spark-submit started this interpreter (it hands us its JVM gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _driver_logs(level: str) -> str:
    """The driver JVM option that points log4j at `log4j2_properties` (written to a file)."""
    log_config = Path(tempfile.gettempdir()) / f"roarmq-pipeline-log4j2-{level}.properties"
    text = log4j2_properties(level)
    if not log_config.exists() or log_config.read_text() != text:
        tmp = log_config.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, log_config)
    return f"-Dlog4j2.configurationFile=file:{log_config}"


def local_conf(cores: int | None, log_level: str = "warn") -> dict[str, str]:
    """Settings for the embedded local mode (not applied under spark-submit)."""
    parallelism = cores or os.cpu_count() or 2
    return {
        "spark.driver.extraJavaOptions": _driver_logs(log_level),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(2, 2 * parallelism)),
    }


#: What the executors' Python must have installed besides RoarMQ's own code (shipped).
EXECUTOR_REQUIREMENTS = ("pyarrow", "pyroaring")


def code_zip(directory: str | Path | None = None) -> Path:
    """A zip of the ``roarmq`` package (broker, protocol, pipeline) for executors that do not
    have RoarMQ installed: Spark puts it on their ``sys.path`` (``addPyFile``).

    Built from the modules this driver imports, named by a hash of their contents so that
    repeated runs reuse it; it goes to ``directory`` (default: the system temp directory),
    never into the working tree.
    """
    import hashlib
    import zipfile

    import roarmq

    sources: list[tuple[str, Path]] = [("roarmq/__init__.py", Path(roarmq.__file__))]
    for name in ("broker", "protocol", "pipeline"):
        package = __import__(f"roarmq.{name}", fromlist=["__path__"])
        base = Path(package.__path__[0])
        for path in sorted(base.rglob("*")):
            if path.suffix in (".py", ".xml") and "__pycache__" not in path.parts:
                sources.append((f"roarmq/{name}/{path.relative_to(base).as_posix()}", path))
    digest = hashlib.sha256()
    for arcname, path in sources:
        digest.update(arcname.encode() + b"\0" + path.read_bytes())
    target = Path(directory or tempfile.gettempdir()) / f"roarmq-{digest.hexdigest()[:16]}.zip"
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for arcname, path in sources:
                zf.write(path, arcname)
        os.replace(tmp, target)
    return target


def _cluster_python() -> str:
    """The Python the executors run: PYSPARK_PYTHON if set, else this interpreter's path
    (right for a cluster on this machine; on other machines that path must exist)."""
    python = os.environ.get("PYSPARK_PYTHON") or sys.executable
    os.environ["PYSPARK_PYTHON"] = python
    print(
        f"roarmq.pipeline: executors run {python} (set PYSPARK_PYTHON to change); it needs "
        f"{' and '.join(EXECUTOR_REQUIREMENTS)}; RoarMQ's own code is shipped to them",
        file=sys.stderr,
        flush=True,
    )
    return python


def cluster_conf(log_level: str = "warn") -> dict[str, str]:
    """Settings for a cluster master started from here (not under spark-submit): the same
    quiet logging as local mode; the UI stays on (a cluster's users look at it)."""
    return {"spark.driver.extraJavaOptions": _driver_logs(log_level)}


def _cores(master: str) -> int | None:
    """``local[4]`` -> 4, ``local[*]``/``local`` -> None (all) or 1."""
    if master == "local":
        return 1
    if master.startswith("local[") and master[6:-1].isdigit():
        return int(master[6:-1])
    return None


def get_spark(
    master: str | None = None,
    app_name: str = "roarmq-pipeline",
    conf: dict[str, str] | None = None,
    log_level: str = "warn",
) -> tuple[Any, bool]:
    """``(session, created)``: an active session is reused (tests, spark-submit, notebooks)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        for key, value in (conf or {}).items():
            active.conf.set(key, value)
        return active, False
    builder = SparkSession.builder.appName(app_name)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
    }
    if not under_spark_submit():
        master = master or "local[*]"
        if master.startswith("local"):
            # Executors are Python processes of this interpreter, importing this checkout.
            os.environ["PYSPARK_PYTHON"] = sys.executable
            os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
            path = os.environ.get("PYTHONPATH", "")
            if str(PROJECT_ROOT) not in path.split(os.pathsep):
                os.environ["PYTHONPATH"] = os.pathsep.join(
                    p for p in (str(PROJECT_ROOT), path) if p
                )
            settings.update(local_conf(_cores(master), log_level))
        else:
            _cluster_python()
            settings.update(cluster_conf(log_level))
        builder = builder.master(master)
    elif master:
        builder = builder.master(master)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not spark.sparkContext.master.startswith("local"):
        # Executors elsewhere import roarmq.pipeline to route: ship this code to them.
        spark.sparkContext.addPyFile(str(code_zip()))
    if under_spark_submit():
        spark.sparkContext.setLogLevel(log_level.upper())
        if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
            # The shuffles here carry counters, not rows: Spark's 200 would be 200 tiny tasks.
            parallelism = spark.sparkContext.defaultParallelism
            spark.conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * parallelism)))
    return spark, True
