"""Structured, quiet-by-default logging.

Log records carry their facts in `extra` (conn, channel, code, ...); the text
formatter appends them as key=value pairs and the JSON formatter emits one
object per line, so the same call serves people and log collectors.
"""

from __future__ import annotations

import json
import logging
import sys
import time

#: Between INFO and WARNING: the broker's life (start, listeners, recovery, shutdown), logged
#: at the default level while per-connection events (INFO) stay quiet.
NOTICE = 25
logging.addLevelName(NOTICE, "NOTICE")

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{ts}.{int(record.msecs):03d}Z {record.levelname.lower():8} {record.name}: {record.getMessage()}"
        extras = _extras(record)
        if extras:
            line += " " + " ".join(
                f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                for k, v in extras.items()
            )
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(
            {
                k: v if isinstance(v, (int, float, str, bool, type(None))) else str(v)
                for k, v in _extras(record).items()
            }
        )
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(level: str = "notice", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger("roarmq")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # An exception escaping a timer or callback is reported by asyncio's own logger; it is
    # a broker error like any other, so it goes to the same place in the same format.
    aio = logging.getLogger("asyncio")
    aio.handlers[:] = [handler]
    aio.setLevel(logging.WARNING)
    aio.propagate = False
