"""The worker's event loop on real sockets: read and write events, paused reads (backpressure) that still
notice the peer's end, timers, and the per-turn clock."""

from __future__ import annotations

import gc
import socket
import time
import weakref

import pytest

from shmbroker.workers.eventloop import EventLoop


@pytest.fixture
def loop():
    loop = EventLoop()
    yield loop
    loop.close()


@pytest.fixture
def sockets():
    """A connected pair (ours non-blocking, as the worker's are), closed afterwards."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def run_turns(loop: EventLoop, turns: int, sleep_cap_s: float = 0.05) -> None:
    """Run the loop for about `turns` turns of at most `sleep_cap_s` each."""
    timer = loop.call_later(turns * sleep_cap_s, loop.stop)
    loop.run()
    timer.cancel()


def test_paused_reads_are_not_delivered_until_resumed(loop, sockets):
    ours, theirs = sockets
    got = []
    loop.watch(ours, lambda: got.append(ours.recv(100)))
    loop.pause_reading(ours)
    assert not loop.reading(ours)
    theirs.sendall(b"held back")
    run_turns(loop, 3)
    assert got == []
    loop.resume_reading(ours)
    assert loop.reading(ours)
    run_turns(loop, 3)
    assert got == [b"held back"]


def test_a_paused_socket_still_notices_its_peer_going(loop, sockets):
    ours, theirs = sockets
    events = []
    loop.watch(ours, lambda: events.append("read"), on_hangup=lambda: (events.append("hangup"), loop.unwatch(ours)))
    loop.pause_reading(ours)
    theirs.sendall(b"unread")
    theirs.close()
    run_turns(loop, 3)
    assert events == ["hangup"]


def test_write_handler_only_while_wanted_and_pause_keeps_it(loop, sockets):
    ours, _ = sockets
    writes = []
    loop.watch(ours, lambda: None)
    loop.want_write(ours, lambda: writes.append(1))
    loop.pause_reading(ours)  # pausing reads keeps the write handler
    run_turns(loop, 2)
    assert len(writes) >= 1
    loop.want_write(ours, None)
    writes.clear()
    run_turns(loop, 2)
    assert writes == []


def test_timers_run_in_order_and_cancelled_ones_never(loop):
    ran = []
    loop.call_later(0.02, lambda: ran.append("b"))
    loop.call_later(0.01, lambda: ran.append("a"))
    loop.call_later(0.015, lambda: ran.append("x")).cancel()
    loop.call_later(0.03, loop.stop)
    loop.run()
    assert ran == ["a", "b"]


def test_a_cancelled_timer_lets_go_of_what_its_callback_holds_at_once(loop):
    """A connection's deadline timer holds the connection in its callback: kept until the timer left the heap, the
    pair was a reference cycle only a garbage collection frees (tests/test_reference_cycles.py)."""

    class Held:
        pass

    def arm() -> tuple:
        held = Held()
        return loop.call_later(3600, lambda: held), weakref.ref(held)

    gc.disable()
    try:
        timer, held = arm()
        assert held() is not None
        timer.cancel()
        assert held() is None
    finally:
        gc.enable()


def test_now_is_taken_once_per_turn(loop):
    before = time.monotonic()
    run_turns(loop, 2, sleep_cap_s=0.01)
    assert before <= loop.now <= time.monotonic()


def test_a_file_is_watched_once(loop, sockets):
    ours, _ = sockets
    loop.watch(ours, lambda: None)
    with pytest.raises(KeyError):
        loop.watch(ours, lambda: None)
    loop.unwatch(ours)
    loop.unwatch(ours)  # twice is harmless
