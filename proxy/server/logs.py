"""Structured log lines: logfmt (key=value) for people, JSON for log pipelines."""

from __future__ import annotations

import json
import logging
import time


class _JsonFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.worker is not None:
            entry["worker"] = self.worker
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


class _LogfmtFormatter(logging.Formatter):
    def __init__(self, worker: int | None = None) -> None:
        super().__init__()
        self.worker = "" if worker is None else f" worker={worker}"

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = (f"ts={ts} level={record.levelname.lower()} logger={record.name}{self.worker} "
                f"msg={json.dumps(record.getMessage())}")
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


def configure_logging(level: str = "INFO", fmt: str = "logfmt", worker: int | None = None) -> None:
    """``worker``: the index of a worker process (``workers``), added to every line."""
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter(worker) if fmt == "json" else _LogfmtFormatter(worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
