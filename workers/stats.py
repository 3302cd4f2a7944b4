"""A network worker's row of the stats segment (shm.stats): the counters it adds to as it serves, and the gauges
read from its parts, published together every stats.publish_interval_ms.

Invariants:
- `counts` is the row writer's own list: the request path adds to it by the offsets below (a list item per
  event, no call), and readers see nothing of it until `publish` copies the row to the segment.
- The gauges are read only when the row is published, from the parts that keep them (the loop's beats, the
  connections, the delayed requests, the balance and the moves, the ring); the parts know nothing of the segment.
- Only the worker's process writes its row; it is published once right as the loop starts, then every interval.
- The row's area of denials per principal is published with the row, when a refusal was counted since the last.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable

from shmbroker.shm import instance as shm_instance
from shmbroker.shm import stats as S
from shmbroker.workers.eventloop import EventLoop

REQUESTS = S.OFFSETS["requests"]  # + api key: requests read
REQUEST_ERRORS = S.OFFSETS["request_errors"]  # + api key: requests that failed to decode or to be handled
AUTHORIZATION_DENIALS = S.OFFSETS["authorization_denials"]  # + api key: operations the authorizer refused
BYTES_IN = S.OFFSETS["bytes_in"]  # + api key
BYTES_OUT = S.OFFSETS["bytes_out"]  # + api key
BYTES_SENDFILE = S.OFFSETS["bytes_sendfile"]
ERROR_RESPONSES = S.OFFSETS["error_responses"]  # + api key: responses carrying an error code
ERROR_CODES = S.OFFSETS["error_codes"]  # + error code (the last slot counts every higher one)
LAST_ERROR_CODE = S.MAX_ERROR_CODES - 1
ACCEPTED = S.OFFSETS["connections_accepted"]
CLOSED_ON_ERROR = S.OFFSETS["connections_closed_on_error"]

Gauges = Callable[[], Iterable[tuple]]
Denials = Callable[[], tuple[int, dict[str, dict[int, int]]]]  # (refusals counted so far, per principal per API)


class WorkerStats:
    def __init__(self, instance: str, index: int, interval_s: float) -> None:
        self.segment = S.StatsSegment.attach(shm_instance.stats_name(instance))
        self.writer = self.segment.writer(S.worker_row(index), "worker", index, os.getpid())
        self.counts = self.writer.counts
        self.interval_s = interval_s
        self.denials_area = self.segment.denials_by_principal[S.worker_row(index)]

    def start(self, loop: EventLoop, gauges: Gauges, denials: Denials | None = None) -> None:
        """Publish the row now and then every interval, with the gauges `gauges()` reads at that moment, and the
        denials per principal `denials()` gives when they moved."""
        published_denials = 0

        def publish() -> None:
            nonlocal published_denials
            writer = self.writer
            for gauge in gauges():  # (name, value) or (name, value, position in the field's array)
                writer.set(*gauge)
            writer.publish()
            if denials is not None:
                counted, by_principal = denials()
                if counted != published_denials:
                    self.denials_area.publish({principal: {str(api): count for api, count in apis.items()}
                                               for principal, apis in by_principal.items()})
                    published_denials = counted
            loop.call_later(self.interval_s, publish)

        publish()

    def close(self) -> None:
        self.segment.close()
