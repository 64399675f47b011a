"""Structured log lines: logfmt (key=value) for people, JSON for log pipelines."""

from __future__ import annotations

import json
import logging
import time


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, separators=(",", ":"))


class _LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"
        line = f"ts={ts} level={record.levelname.lower()} logger={record.name} msg={json.dumps(record.getMessage())}"
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


def configure_logging(level: str = "INFO", fmt: str = "logfmt") -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_JsonFormatter() if fmt == "json" else _LogfmtFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
