#!/usr/bin/env python3
"""Benchmark: shm ring vs os.pipe, multiprocessing Pipe and Queue, two processes.

For each transport and frame size it measures, in the same run:
  - throughput: a writer process sends frames as fast as it can for --seconds; the reader
    process takes each frame as a separate message, in the batches the transport delivers
    (ring: in-place memoryviews of one read_batch; os-pipe: views into its read buffer after
    splitting what one read returned by length prefix; mp: one bytes per receive).
  - one-way latency p50/p99: the writer sends one frame every 1/--pace-hz s carrying
    time.perf_counter_ns() (CLOCK_MONOTONIC, shared by processes); the reader sleeps
    in the kernel between frames as the node's processes do (ring: in a selector on an eventfd
    doorbell, as a network worker; on a semaphore with --ring-doorbell semaphore, as the timer
    process; os-pipe: a blocking read). The ring's writer calls write_many, as the node does.
    The first --latency-warmup-seconds of frames are not counted.
  - idle CPU: CPU time the blocked reader uses over --idle-seconds with nothing sent.
Each measurement is repeated --runs times, interleaved across transports; medians of the
values and of the per-run ratios to os-pipe (`*_vs_os_pipe`; MB/s ratio = frames/s ratio) are reported.
Latency samples of all runs are also pooled per transport (`p50_us_pooled`, `p99_us_pooled`,
`p99_us_pooled_vs_os_pipe`), the steadier p99 figure on a noisy machine. How far the median ratios can be
trusted: `*_vs_os_pipe_ci95`, a bootstrap 95% interval of the median per-run ratio, and
`p99_us_le_os_pipe_share`, the share of runs whose p99 was at or below os-pipe's in the same run.

Batching: the ring writer publishes up to --batch frames and --batch-bytes bytes per head update
(write_many); os.pipe does one os.write per frame unless --pipe-batch > 1 (then one write per batch).
The byte bound keeps a batch well below the ring's capacity: a 64-frame batch of 64 KiB frames would fill
a 4 MiB ring in one head update, and writer and reader would take turns instead of overlapping.

--json prints one JSON object per (transport, size).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import multiprocessing as mp
import os
import selectors
import statistics
import struct
import sys
import time

import numpy as np
import psutil

from shmbroker.shm.doorbell import EventfdDoorbell
from shmbroker.shm.instance import Instance, object_name
from shmbroker.shm.ring import RingConfig, RingReader, RingWriter, announce_sleep_all, woke_all
from shmbroker.shm import ring as shm_ring

TRANSPORTS = ("shm-ring", "os-pipe", "mp-pipe", "mp-queue")
F_SETPIPE_SZ = 1031
_LEN = struct.Struct("<I")
_STAMP = struct.Struct("<q")


# --------------------------------------------------------------------------- transports
class RingTransport:
    name = "shm-ring"

    def __init__(self, args) -> None:
        self.instance = Instance.start(f"bench{os.getpid()}")
        self.ring_name = self.instance.create_ring(object_name(self.instance.instance_id, "bench"),
                                                   RingConfig(capacity=args.ring_capacity))
        # eventfd: how a network worker sleeps (completion rings); semaphore: how the timer process sleeps
        # (request rings). Both wait() without a separate drain on the wakeup path.
        self.bell = (self.instance.create_semaphore_doorbell(object_name(self.instance.instance_id, "bell"))
                     if args.ring_doorbell == "semaphore" else EventfdDoorbell())
        self.batch = args.batch
        self.full_pause_s = args.full_pause_us / 1e6
        self.read_batch = args.read_batch
        self.spin_s = args.spin_us / 1e6

    def close(self) -> None:
        self.bell.close()
        self.instance.shutdown()

    # writer side
    def open_writer(self):
        self.writer = RingWriter(self.ring_name, self.bell, takeover=True)

    def send_batch(self, frames) -> None:
        sent = 0
        while sent < len(frames):
            n = self.writer.write_many(frames[sent:] if sent else frames)
            sent += n
            if n == 0:
                time.sleep(self.full_pause_s)  # full: sleep, so the reader gets the CPU

    def send_one(self, frame) -> None:
        while not self.writer.write_many([frame]):
            time.sleep(self.full_pause_s)

    # reader side
    def open_reader(self):
        self.reader = RingReader(self.ring_name, takeover=True)
        self.selector = None
        if isinstance(self.bell, EventfdDoorbell):
            self.selector = selectors.DefaultSelector()
            self.selector.register(self.bell.fileno(), selectors.EVENT_READ)

    def _sleep(self) -> None:
        """As the node's processes sleep: a network worker in its selector over the eventfd (drain, announce,
        select, woke), the timer process on its semaphore (announce_sleep_all, wait, woke_all)."""
        reader, bell = self.reader, self.bell
        if self.selector is None:
            if announce_sleep_all([reader]):
                bell.wait(None)
            woke_all([reader])
            return
        bell.drain()
        if reader.announce_sleep():
            self.selector.select(None)
        reader.woke()

    def recv_frames(self, on_batch) -> None:
        """Calls on_batch(frames) per batch of in-place views until it returns True; sleeps when empty."""
        reader = self.reader
        max_frames, spin_s = self.read_batch, self.spin_s
        while True:
            if spin_s and not reader.has_pending():  # a producer in full flow refills within microseconds
                spin_end = time.perf_counter() + spin_s
                while not reader.has_pending() and time.perf_counter() < spin_end:
                    pass
            frames = reader.read_batch(max_frames)
            if not frames:
                self._sleep()  # the blocking read, as os.read is for os.pipe
                continue
            stop = on_batch(frames)
            del frames
            reader.release()
            if stop:
                return


class OsPipeTransport:
    name = "os-pipe"

    def __init__(self, args) -> None:
        self.rfd, self.wfd = os.pipe()
        for fd in (self.rfd, self.wfd):
            try:
                fcntl.fcntl(fd, F_SETPIPE_SZ, 1 << 20)  # same order of buffering as the ring
            except OSError:
                pass
        self.pipe_batch = args.pipe_batch

    def close(self) -> None:
        for fd in (self.rfd, self.wfd):
            try:
                os.close(fd)
            except OSError:
                pass

    def open_writer(self):
        pass

    def send_batch(self, frames) -> None:
        wfd = self.wfd
        if self.pipe_batch > 1:
            step = self.pipe_batch
            for i in range(0, len(frames), step):
                os.write(wfd, b"".join(_LEN.pack(len(f)) + f for f in frames[i : i + step]))
        else:
            for frame in frames:
                os.write(wfd, _LEN.pack(len(frame)) + frame)

    def send_one(self, frame) -> None:
        os.write(self.wfd, _LEN.pack(len(frame)) + frame)

    def open_reader(self):
        pass

    def recv_frames(self, on_batch) -> None:
        """Reads what the pipe has (one syscall), splits it into frames, on_batch(frames)."""
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        have = pos = 0
        unpack = _LEN.unpack_from
        while True:
            n = os.readv(self.rfd, [view[have:]])
            if n == 0:
                return
            have += n
            frames = []
            append = frames.append
            while have - pos >= 4:
                (length,) = unpack(buf, pos)
                if have - pos - 4 < length:
                    break
                append(view[pos + 4 : pos + 4 + length])
                pos += 4 + length
            if frames:
                stop = on_batch(frames)
                del frames
                if stop:
                    return
            buf[: have - pos] = buf[pos:have]
            have -= pos
            pos = 0


class _FramePerCallTransport:
    """multiprocessing's transports: one call sends a frame (`_send`), one receives it (`_receive`)."""

    def open_writer(self):
        pass

    def send_batch(self, frames) -> None:
        send = self._send
        for frame in frames:
            send(frame)

    def send_one(self, frame) -> None:
        self._send(frame)

    def open_reader(self):
        pass

    def recv_frames(self, on_batch) -> None:
        receive = self._receive
        while not on_batch([receive()]):
            pass


class MpPipeTransport(_FramePerCallTransport):
    name = "mp-pipe"

    def __init__(self, args) -> None:
        self.rconn, self.wconn = mp.get_context("fork").Pipe(duplex=False)
        self._send, self._receive = self.wconn.send_bytes, self.rconn.recv_bytes

    def close(self) -> None:
        self.rconn.close()
        self.wconn.close()


class MpQueueTransport(_FramePerCallTransport):
    name = "mp-queue"

    def __init__(self, args) -> None:
        # Bounded like the ring (same bytes in flight), else a fast writer just grows memory.
        self.queue = mp.get_context("fork").Queue(maxsize=max(1, args.ring_capacity // args.current_size))
        self._send, self._receive = self.queue.put, self.queue.get

    def close(self) -> None:
        self.queue.close()
        self.queue.join_thread()


TRANSPORT_CLASSES = {cls.name: cls for cls in (RingTransport, OsPipeTransport, MpPipeTransport, MpQueueTransport)}

# --------------------------------------------------------------------------- measurements
END = b""  # a zero-length frame ends a measurement
WARMUP_STAMP = -1  # a latency frame sent during the warm-up, not counted


def _end_writes(transport) -> None:
    """The END frame; a queue's feeder thread then hands over every frame before the writer process exits."""
    transport.send_one(END)
    if isinstance(transport, MpQueueTransport):
        transport.queue.close()
        transport.queue.join_thread()


def _throughput_writer(transport, size, seconds, batch) -> None:
    transport.open_writer()
    frames = [bytes([i % 251]) * size for i in range(batch)]
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        transport.send_batch(frames)
    _end_writes(transport)


def _throughput_reader(transport, result) -> None:
    transport.open_reader()
    state = {"frames": 0, "bytes": 0, "start": None}

    def on_batch(frames) -> bool:
        """Takes every frame (its length); the first batch only starts the clock."""
        sizes = list(map(len, frames))
        if state["start"] is None:
            state["start"] = time.perf_counter()
        else:
            state["frames"] += len(sizes)
            state["bytes"] += sum(sizes)
        return sizes[-1] == 0  # END is the writer's last frame

    transport.recv_frames(on_batch)
    elapsed = time.perf_counter() - state["start"]
    result.send((state["frames"] - 1, state["bytes"], elapsed))  # minus END


def _latency_writer(transport, size, seconds, pace_hz, warmup_seconds) -> None:
    """Paced frames carrying their send time; the first warmup_seconds of them carry WARMUP_STAMP instead (the
    reader skips those), so process start-up and first-touch costs stay out of the figures."""
    transport.open_writer()
    filler = b"\0" * max(0, size - 8)
    interval = 1.0 / pace_hz
    warmup = int(warmup_seconds * pace_hz)
    count = int(seconds * pace_hz)
    next_at = time.perf_counter()
    for i in range(warmup + count):
        next_at += interval
        pause = next_at - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        transport.send_one(_STAMP.pack(time.perf_counter_ns() if i >= warmup else WARMUP_STAMP) + filler)
    _end_writes(transport)


def _latency_reader(transport, result) -> None:
    transport.open_reader()
    samples = []

    def on_batch(frames) -> bool:
        now = time.perf_counter_ns()
        for frame in frames:
            if len(frame) == 0:
                return True
            (stamp,) = _STAMP.unpack_from(frame)
            if stamp != WARMUP_STAMP:
                samples.append(now - stamp)
        return False

    transport.recv_frames(on_batch)
    result.send(samples)


def percentile_us(sorted_ns: list[int], q: float) -> float | None:
    """Nearest-rank percentile q (0..1) of sorted nanosecond samples, in microseconds."""
    if not sorted_ns:
        return None
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1000


def _idle_reader(transport, result) -> None:
    transport.open_reader()
    transport.recv_frames(lambda frames: True)
    result.send("done")


def _run_pair(transport, writer_fn, writer_args, reader_fn, timeout):
    ctx = mp.get_context("fork")
    result_r, result_w = ctx.Pipe(duplex=False)
    reader = ctx.Process(target=reader_fn, args=(transport, result_w))
    reader.start()
    writer = ctx.Process(target=writer_fn, args=(transport, *writer_args))
    writer.start()
    try:
        if not result_r.poll(timeout):
            raise TimeoutError(f"{transport.name}: no result in {timeout} s")
        return result_r.recv()
    finally:
        for proc in (writer, reader):
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        result_r.close()
        result_w.close()


def measure_once(name: str, size: int, args, with_idle: bool) -> dict:
    """One run of every measurement for one (transport, size)."""
    args.current_size = size
    sample = {"idle_cpu_pct": None}
    transport = TRANSPORT_CLASSES[name](args)
    try:
        batch = max(1, min(args.batch, args.batch_bytes // max(size, 1)))
        frames, nbytes, elapsed = _run_pair(transport, _throughput_writer, (size, args.seconds, batch),
                                            _throughput_reader, args.seconds * 4 + 30)
        sample["frames_per_s"] = frames / elapsed
        sample["mb_per_s"] = nbytes / elapsed / 1e6
    finally:
        transport.close()
    transport = TRANSPORT_CLASSES[name](args)
    try:
        latencies = sorted(_run_pair(transport, _latency_writer,
                                     (size, args.latency_seconds, args.pace_hz, args.latency_warmup_seconds),
                                     _latency_reader, (args.latency_seconds + args.latency_warmup_seconds) * 4 + 30))
        sample["latency_ns"] = latencies
        sample["p50_us"], sample["p99_us"] = percentile_us(latencies, 0.5), percentile_us(latencies, 0.99)
    finally:
        transport.close()
    if with_idle:
        sample["idle_cpu_pct"] = measure_idle(name, args)
    return sample


def measure_size(size: int, args) -> list[dict]:
    """All transports for one size. Runs are interleaved (run 1 of every transport, then
    run 2, ..., every other run in reverse order) so load from other work on the machine
    hits all of them alike; ratios to os-pipe are taken within each run, then the median of
    values and ratios is reported. Latency is also pooled over all runs (`*_pooled`): on a
    noisy machine the p99 of one run swings by tens of percent, the pooled p99 much less."""
    samples = {name: [] for name in args.transports}
    for run in range(args.runs):
        order = args.transports if run % 2 == 0 else args.transports[::-1]
        for name in order:
            samples[name].append(measure_once(name, size, args, args.idle_seconds > 0 and size == args.sizes[0]))
    pooled = {name: sorted(ns for sample in runs for ns in sample["latency_ns"]) for name, runs in samples.items()}
    rows = []
    for name in args.transports:
        row = {"transport": name, "size": size, "runs": args.runs}
        for key in ("frames_per_s", "mb_per_s", "p50_us", "p99_us", "idle_cpu_pct"):
            values = [sample[key] for sample in samples[name] if sample[key] is not None]
            row[key] = round(statistics.median(values), 3) if values else None
        if name == RingTransport.name:  # which paths the figures are for (the C ones unless it failed to build)
            compiled = shm_ring._ringops is not None
            row["ring_write_path"] = "compiled" if compiled else "python"
            row["ring_doorbell"] = args.ring_doorbell
        row["latency_samples"] = len(pooled[name])
        row["p50_us_pooled"] = percentile_us(pooled[name], 0.5)
        row["p99_us_pooled"] = percentile_us(pooled[name], 0.99)
        if "os-pipe" in samples and name != "os-pipe":
            for key in ("frames_per_s", "p99_us"):
                ratios = [mine[key] / base[key] for mine, base in zip(samples[name], samples["os-pipe"])
                          if mine[key] and base[key]]
                row[f"{key}_vs_os_pipe"] = round(statistics.median(ratios), 3) if ratios else None
                row[f"{key}_vs_os_pipe_ci95"] = median_ci95(ratios, args.bootstrap_resamples)
                if key == "p99_us":
                    row["p99_us_le_os_pipe_share"] = (round(sum(r <= 1 for r in ratios) / len(ratios), 3)
                                                      if ratios else None)
            base_p99 = percentile_us(pooled["os-pipe"], 0.99)
            if row["p99_us_pooled"] and base_p99:
                row["p99_us_pooled_vs_os_pipe"] = round(row["p99_us_pooled"] / base_p99, 3)
        rows.append(row)
    return rows


def median_ci95(values: list[float], resamples: int, seed: int = 0) -> list[float] | None:
    """Percentile-bootstrap 95% interval of the median of `values` (a fixed seed, so a rerun on the same
    samples prints the same interval). Per-run p99 ratios on a shared VM swing by tens of percent from run to
    run; the interval says whether a median ratio is apart from 1 or within the noise."""
    if not values:
        return None
    samples = np.asarray(values, dtype=float)
    draws = np.random.default_rng(seed).choice(samples, size=(resamples, len(samples)), replace=True)
    low, high = np.percentile(np.median(draws, axis=1), [2.5, 97.5])
    return [round(float(low), 3), round(float(high), 3)]


def measure_idle(name: str, args) -> float:
    """CPU% of a reader blocked with nothing to read, over --idle-seconds."""
    args.current_size = args.sizes[0]
    transport = TRANSPORT_CLASSES[name](args)
    ctx = mp.get_context("fork")
    result_r, result_w = ctx.Pipe(duplex=False)
    reader = ctx.Process(target=_idle_reader, args=(transport, result_w))
    reader.start()
    try:
        time.sleep(0.3)  # let it reach its blocking wait
        proc = psutil.Process(reader.pid)
        before = proc.cpu_times()
        time.sleep(args.idle_seconds)
        after = proc.cpu_times()
        used = (after.user - before.user) + (after.system - before.system)
        transport.open_writer()
        transport.send_one(END)
        result_r.poll(10)
        return 100.0 * used / args.idle_seconds
    finally:
        reader.join(5)
        if reader.is_alive():
            reader.kill()
            reader.join()
        result_r.close()
        result_w.close()
        transport.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_rings",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON object per (transport, size)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each throughput measurement")
    parser.add_argument("--latency-seconds", type=float, default=1.0, help="length of each latency measurement")
    parser.add_argument("--latency-warmup-seconds", type=float, default=0.1,
                        help="paced frames sent first and not counted (process start-up, first touches)")
    parser.add_argument("--idle-seconds", type=float, default=1.0, help="idle CPU window (0: skip)")
    parser.add_argument("--runs", type=int, default=3, help="repetitions; the median is reported")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 4096, 65536])
    parser.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=TRANSPORTS)
    parser.add_argument("--batch", type=int, default=64, help="frames per writer batch")
    parser.add_argument("--batch-bytes", type=int, default=256 << 10,
                        help="bytes per writer batch at most (a batch holds at least one frame)")
    parser.add_argument("--pipe-batch", type=int, default=1, help="frames per os.write for os-pipe")
    parser.add_argument("--bootstrap-resamples", type=int, default=2000,
                        help="resamples for the 95%% intervals of the median ratios")
    parser.add_argument("--pace-hz", type=float, default=5000.0, help="frame rate of the latency test")
    parser.add_argument("--ring-capacity", type=int, default=1 << 22)
    parser.add_argument("--read-batch", type=int, default=4096, help="max frames per ring read_batch")
    parser.add_argument("--spin-us", type=float, default=0.0,
                        help="ring reader polls this long before announcing sleep")
    parser.add_argument("--ring-doorbell", choices=["eventfd", "semaphore"], default="eventfd",
                        help="how the ring's consumer sleeps: like a network worker (eventfd) or the timer (semaphore)")
    parser.add_argument("--full-pause-us", type=float, default=100.0,
                        help="how long the ring writer sleeps when the ring is full")
    args = parser.parse_args(argv)
    results = []
    for size in args.sizes:
        for row in measure_size(size, args):
            name = row["transport"]
            results.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
            else:
                print(f"{name:9s} {size:6d} B  {row['frames_per_s']:>12,.0f} frames/s  {row['mb_per_s']:>9,.1f} MB/s"
                      f"  p50 {row['p50_us']} us  p99 {row['p99_us']} us (pooled {row['p99_us_pooled']})"
                      f"  idle cpu {row['idle_cpu_pct']} %"
                      f"  x os-pipe: {row.get('frames_per_s_vs_os_pipe')} (frames/s), {row.get('p99_us_vs_os_pipe')} (p99),"
                      f" {row.get('p99_us_pooled_vs_os_pipe')} (pooled p99)",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
