"""Instance lifecycle: names, leftovers of a crashed run, sweeps, and the node's process shape."""

import time

import pytest
from shm_testing import Peer, cleanup_instance, fresh_instance, unique_instance_id

from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.instance import (Instance, InstanceBusy, completion_ring_name, list_objects, object_name,
                                    remove_leftovers, request_ring_name, sweep_dead_instances, timer_doorbell_name)
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter, announce_sleep_all, woke_all


def test_names_carry_prefix_and_instance():
    assert request_ring_name("node1", 0) == "/shmbroker-node1-req-0"
    assert completion_ring_name("node1", 3) == "/shmbroker-node1-done-3"
    assert timer_doorbell_name("node1") == "/shmbroker-node1-timer-bell"
    for bad in ["", "a-b", "a/b", "x" * 41, None]:
        with pytest.raises(ValueError):
            object_name(bad, "req-0")


def test_crashed_runs_leftovers_are_removed_at_start():
    instance_id = unique_instance_id("crash")
    try:
        with Peer("hold_instance", instance_id, 2) as peer:
            peer.expect_line("ready")
            with pytest.raises(InstanceBusy):
                Instance.start(instance_id)  # the owner is alive
            peer.kill9()
        segments, semaphores = list_objects(instance_id)
        assert len(segments) == 5 and len(semaphores) == 1  # lease + 4 rings, timer bell
        instance = Instance.start(instance_id)
        assert list_objects(instance_id) == ([f"/shmbroker-{instance_id}-lease"], [])
        instance.shutdown()
        assert list_objects(instance_id) == ([], [])
    finally:
        cleanup_instance(instance_id)


def test_sweep_removes_only_instances_whose_owner_is_dead():
    prefix = unique_instance_id("sweep")
    dead_id, live_id = prefix + "dead", prefix + "live"
    try:
        with Peer("hold_instance", dead_id, 1) as dead, Peer("hold_instance", live_id, 1) as live:
            dead.expect_line("ready")
            live.expect_line("ready")
            dead.kill9()
            removed = sweep_dead_instances(id_prefix=prefix)
            assert removed and all(name.startswith(f"/shmbroker-{dead_id}-") for name in removed)
            assert list_objects(dead_id) == ([], [])
            assert len(list_objects(live_id)[0]) == 3  # untouched: lease + 2 rings
            with pytest.raises(InstanceBusy):
                remove_leftovers(live_id)
            live.kill9()
        sweep_dead_instances(id_prefix=prefix)
        assert list_objects(live_id) == ([], [])
    finally:
        cleanup_instance(dead_id)
        cleanup_instance(live_id)


def test_node_shape_supervisor_timer_and_two_workers_over_rings_and_doorbells():
    """The supervisor creates everything, workers (Popen + pass_fds) open rings by name and
    sleep in a selector on their eventfd; this process plays the timer on its semaphore."""
    workers = 2
    frames_per_worker = 300
    with fresh_instance("node") as instance:
        instance_id = instance.instance_id
        for worker in range(workers):
            instance.create_ring(request_ring_name(instance_id, worker), RingConfig(capacity=8192))
            instance.create_ring(completion_ring_name(instance_id, worker), RingConfig(capacity=8192))
        timer_bell = instance.create_semaphore_doorbell(timer_doorbell_name(instance_id))
        worker_bells = [EventfdDoorbell() for _ in range(workers)]
        peers = [Peer("echo_worker", instance_id, worker, worker_bells[worker].fileno(),
                      pass_fds=(worker_bells[worker].fileno(),)) for worker in range(workers)]
        try:
            completions = [RingWriter(completion_ring_name(instance_id, w), worker_bells[w]) for w in range(workers)]
            requests = [RingReader(request_ring_name(instance_id, w)) for w in range(workers)]
            echoed = [[] for _ in range(workers)]
            sent = [0] * workers
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(len(e) < frames_per_worker + 1 for e in echoed):
                for w in range(workers):
                    if sent[w] < frames_per_worker:
                        batch = [b"w%d-%d" % (w, i) for i in range(sent[w], min(sent[w] + 7, frames_per_worker))]
                        sent[w] += completions[w].write_many(batch)
                        if sent[w] == frames_per_worker:
                            completions[w].write(b"stop", timeout=5)
                    frames = requests[w].read_batch()
                    echoed[w] += [bytes(frame) for frame in frames]
                    del frames
                    requests[w].release()
                if all(s == frames_per_worker for s in sent):
                    timer_bell.drain()
                    if announce_sleep_all(requests):
                        timer_bell.wait(1.0)
                        woke_all(requests)
            for w in range(workers):
                expected = [b"w%d-%d" % (w, i) for i in range(frames_per_worker)] + [b"stop"]
                assert echoed[w] == expected
                peers[w].wait_ok(timeout=10)
                assert requests[w].producer_alive() is False
            for ring in completions + requests:
                ring.close()
        finally:
            for peer in peers:
                peer.close()
            for bell in worker_bells:
                bell.close()
            timer_bell.close()
