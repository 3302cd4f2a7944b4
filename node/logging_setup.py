"""Logging of every process of the node: one line per record on stderr, naming the process's role and pid.

Invariant: each process calls `setup_logging` once, first thing in its main(), so every later record
(a child's boot included) carries its role.
"""

from __future__ import annotations

import logging
import sys


def setup_logging(role: str) -> None:
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s {role}[%(process)d] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
