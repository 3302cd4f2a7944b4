"""Process titles: `ps` shows `shmbroker: supervisor 127.0.0.1:9092 /var/lib/shmbroker/data`, `shmbroker: timer`,
`shmbroker: worker 1 127.0.0.1:9092` instead of a Python command line (setproctitle rewrites argv in place)."""

from __future__ import annotations

import setproctitle

PREFIX = "shmbroker: "


def set_title(what: str) -> None:
    setproctitle.setproctitle(PREFIX + what)
