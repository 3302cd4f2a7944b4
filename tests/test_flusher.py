"""The flusher (node.timer.flusher) on a real data directory: urgent syncs beside a group-commit round."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from shmbroker.node import config as node_config
from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.records import build_batch
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.timer.flusher import Flusher
from tests.record_batches import SharedTable

pytestmark = pytest.mark.usefixtures("nothing_left_in_dev_shm")

WAIT_S = 10.0


def reported_rows(flusher: Flusher, until: float) -> set[int]:
    """Rows of the flush reports that came before `until` (monotonic), or as soon as one came."""
    rows: set[int] = set()
    while time.monotonic() < until and not rows:
        while not flusher.reports.empty():
            rows.update(flusher.reports.get_nowait().flushed)
        time.sleep(0.005)
    return rows


def test_an_urgent_sync_is_reported_while_the_round_in_flight_is_stuck(tmp_path):
    config = NodeConfig()
    config = replace(config, server=replace(config.server, data_dir=str(tmp_path)))
    with SharedTable(rows=4) as table:
        store = PartitionStore(str(tmp_path), table, config.log, 4)
        flusher = Flusher(config, table, lambda: None)
        try:
            store.create_topics([("data", 1, {}), ("state", 1, {})])
            flusher.catalog_version = store.version
            data, state = store.log(store.row("data", 0)), store.log(store.row("state", 0))
            flusher.start()
            deadline = time.monotonic() + WAIT_S
            while flusher.rounds < 1 and time.monotonic() < deadline:  # the first round, at start, is over
                time.sleep(0.005)
            data.append(build_batch([(b"k", b"v")], 1000))
            with data.lock:  # the round syncs the data partition, then waits for its lock to publish: stuck
                flusher.request()
                time.sleep(0.1)
                state.append(build_batch([(b"k", b"state")], 1000))
                flusher.sync_now([state.row])
                assert reported_rows(flusher, time.monotonic() + WAIT_S) == {state.row}
                assert state.state().flushed_offset == state.state().log_end_offset
                assert data.state().flushed_offset < data.state().log_end_offset  # the round is still stuck
            assert data.row in reported_rows(flusher, time.monotonic() + WAIT_S)  # and ends once the lock is free
            assert data.state().flushed_offset == data.state().log_end_offset
        finally:
            flusher.stop(WAIT_S)
            store.close()
    assert not flusher.is_alive()


def test_the_timer_gil_switch_interval_is_a_positive_setting(tmp_path):
    """The timer loop shares its process with the flusher's threads; its GIL switch interval is a setting."""
    path = tmp_path / "node.toml"
    path.write_text("[timer]\ngil_switch_interval_us = 250\n")
    assert node_config.load(str(path)).timer.gil_switch_interval_us == 250
    path.write_text("[timer]\ngil_switch_interval_us = 0\n")
    with pytest.raises(node_config.ConfigError, match="gil_switch_interval_us must be positive"):
        node_config.load(str(path))
