"""structlog set-up: JSON lines when not on a terminal, readable lines when on one."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure_logging(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog once for a CLI or daemon process (libraries never call this).

    ``level`` defaults to ``$SBX_LOG_LEVEL`` or ``info``; ``json`` defaults to "stderr is not
    a terminal". Logs go to stderr so stdout stays clean for command output.
    """
    name = (level or os.environ.get("SBX_LOG_LEVEL") or "info").upper()
    numeric = logging.getLevelName(name)
    if not isinstance(numeric, int):
        numeric = logging.INFO
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if as_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
