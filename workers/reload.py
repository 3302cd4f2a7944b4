"""SIGHUP: the supervisor rewrote the config file with new reloadable settings (node.config.RELOADABLE), and
the worker takes them.

Invariants:
- The signal handler only notes the request (`requested`); the worker reloads before its loop's next sleep,
  between handlers, never inside one. Several signals before then make one reload.
- Only the reloadable settings change; a file that cannot be read keeps the running config, with one log
  line. The new config goes to `apply`, which hands it to the parts that use it.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from node.config import NodeConfig, reload_runtime

log = logging.getLogger("shmbroker.worker")


class ConfigReload:
    def __init__(self, path: str, config: NodeConfig, apply: Callable[[NodeConfig], None]) -> None:
        self.path = path
        self.config = config
        self._apply = apply
        self.requested = False

    def on_hup(self, signum: int, frame: Any) -> None:
        self.requested = True

    def reload(self) -> None:
        self.requested = False
        config = reload_runtime(self.config, self.path, log)
        if config is None:
            return
        self.config = config
        self._apply(config)
