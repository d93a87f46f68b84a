"""Logging: structlog loggers on top of stdlib logging, so the library stays silent unless
the application configures logging; the CLI and daemon do, with JSON when not on a TTY."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import structlog

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
    structlog.processors.StackInfoRenderer(),
]

# A library must not print by default: without configuration these records go nowhere.
logging.getLogger("supervisor").addHandler(logging.NullHandler())


def get_logger(name: str) -> Any:
    """A structlog logger (``log.info("event", key=value)``; ``.bind()`` for context) that
    emits through the stdlib logger ``name``."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Send the supervisor's logs to stderr (stdout stays for command output and protocols).

    ``level`` defaults to ``$SANDVISOR_LOG_LEVEL`` or ``info``; ``json`` defaults to "stderr is not
    a terminal". For CLIs and the daemon; libraries embedding us configure logging their way.
    """
    name = (level or os.environ.get("SANDVISOR_LOG_LEVEL") or "info").upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        numeric = logging.INFO
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger("supervisor")
    for old in list(root.handlers):
        if not isinstance(old, logging.NullHandler):
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    root.propagate = False
