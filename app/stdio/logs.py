"""Structured JSON logs on stderr: one object per line, no tracebacks (they can carry
request data and are noise for operators; the error type and message are logged instead).

Whatever a call passes in ``extra`` becomes top-level fields of its line, e.g.
``log.info("bound", extra={"pod": "ml/a", "node": "n1", "decision": "bound"})`` prints
``{"time": ..., "level": "info", "logger": ..., "message": "bound", "pod": "ml/a", ...}``."""

from __future__ import annotations

import logging
import sys
import time

import orjson

__all__ = ["configure"]

_RESERVED = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            entry["error"] = f"{type(error).__name__}: {error}"
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                entry[key] = value
        return orjson.dumps(entry, default=str, option=orjson.OPT_NON_STR_KEYS).decode()


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    # One line per API request is noise (and watches would log every reconnect).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpcore").setLevel(logging.WARNING)
