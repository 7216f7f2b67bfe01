"""Lines for the node's syslog, where an admin looks (what `health` did, what renders wrote), through
`audit(ident)`: only to /dev/log, never to the terminal, so a command's output stays as documented."""

from __future__ import annotations

import logging
import logging.handlers

SOCKET = "/dev/log"


def syslog_handler(ident: str) -> logging.Handler | None:
    """A handler for syslog's socket that never fails the command; None where it cannot be opened."""
    try:
        handler = logging.handlers.SysLogHandler(address=SOCKET)
    except OSError:
        return None
    handler.setFormatter(logging.Formatter(f"{ident}: %(message)s"))
    # Python 3.11 opens the socket lazily, on each line: no syslog must cost no traceback on stderr
    handler.handleError = lambda record: None  # type: ignore[method-assign]
    return handler


def audit(ident: str) -> logging.Logger:
    """The logger of `ident` (e.g. `slurm-hetero-health`): INFO and up to syslog, nothing else."""
    logger = logging.getLogger(f"slurm_hetero.core.journal.{ident}")
    if not logger.handlers:
        logger.addHandler(syslog_handler(ident) or logging.NullHandler())
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger
