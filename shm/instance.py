"""Names and lifetime of a node instance's shared objects (ring segments, semaphores).

Every shared object of instance `I` is named `/shmbroker-I-<what>` (e.g.
`/shmbroker-I-req-0`). The supervisor first creates the instance's *lease*, a tiny segment
`/shmbroker-I-lease` holding its (pid, start time), then everything else; on a clean
shutdown it unlinks everything else, then the lease.

Invariants:
- Instance ids match `[A-Za-z0-9_]{1,40}`: no '-', so the prefix `/shmbroker-I-` of one
  instance is never a prefix of another's names.
- An instance is *live* iff its lease exists and names a running process. Objects of an
  instance that is not live are leftovers of a crash: `remove_leftovers(I)` and
  `sweep_dead_instances()` remove them and never touch a live instance's objects.
- Segments and semaphores are found by listing /dev/shm (Linux: segments as `<name>`,
  semaphores as `sem.<name>`).
"""

from __future__ import annotations

import glob
import hashlib
import mmap
import os
import re
from dataclasses import dataclass, field

import posix_ipc

from shmbroker.shm import liveness
from shmbroker.shm.doorbell import SemaphoreDoorbell, unlink_semaphore
from shmbroker.shm.ring import RingConfig, create_ring
from shmbroker.shm.segment import unlink_segment

PREFIX = "shmbroker"
DEV_SHM = "/dev/shm"
_INSTANCE_RE = re.compile(r"^[A-Za-z0-9_]{1,40}$")
_LEASE_BYTES = 4096
_LEASE_MAGIC = 0x4553_4145_4C42_4D53  # "SMBLEASE"


class InstanceBusy(RuntimeError):
    """The instance's lease is held by a live process."""


def check_instance_id(instance_id: str) -> str:
    if not isinstance(instance_id, str) or not _INSTANCE_RE.match(instance_id):
        raise ValueError(f"instance id must match {_INSTANCE_RE.pattern}, got {instance_id!r}")
    return instance_id


def instance_id_for(data_dir: str, port: int) -> str:
    """The instance id of the node serving `data_dir` on `port`: stable across restarts, so a restart
    finds (and removes) what a crashed run of the same node left behind."""
    digest = hashlib.sha1(f"{os.path.realpath(data_dir)}:{port}".encode()).hexdigest()
    return digest[:16]


def object_name(instance_id: str, what: str) -> str:
    """The POSIX name (leading '/') of object `what` of an instance."""
    return f"/{PREFIX}-{check_instance_id(instance_id)}-{what}"


def request_ring_name(instance_id: str, worker: int) -> str:
    """Ring worker `worker` -> timer."""
    return object_name(instance_id, f"req-{worker}")


def completion_ring_name(instance_id: str, worker: int) -> str:
    """Ring timer -> worker `worker`."""
    return object_name(instance_id, f"done-{worker}")


def timer_doorbell_name(instance_id: str) -> str:
    """The semaphore the timer process sleeps on."""
    return object_name(instance_id, "timer-bell")


def table_name(instance_id: str) -> str:
    """The shared partition table (shm.table)."""
    return object_name(instance_id, "partitions")


def watches_name(instance_id: str) -> str:
    """Each worker's own delayed-fetch counts per partition row (shm.interest.WorkerWatches)."""
    return object_name(instance_id, "watches")


def heartbeat_name(instance_id: str) -> str:
    """The children's heartbeat counters, one row per child (shm.heartbeat)."""
    return object_name(instance_id, "heartbeats")


def connections_name(instance_id: str) -> str:
    """Open client connections per worker and per client-address bucket (shm.connections)."""
    return object_name(instance_id, "connections")


def generations_name(instance_id: str) -> str:
    """The change counters of node-wide state workers cache (shm.generations)."""
    return object_name(instance_id, "generations")


def config_path(instance_id: str) -> str:
    """The file of the node's config its children read (a file under /dev/shm, removed with the instance)."""
    return DEV_SHM + object_name(instance_id, "config")


def config_paths() -> list[str]:
    """The config files of every node instance on this machine (see config_path)."""
    return sorted(glob.glob(os.path.join(DEV_SHM, f"{PREFIX}-*-config")))


def stats_name(instance_id: str) -> str:
    """The per-process counters (shm.stats)."""
    return object_name(instance_id, "stats")


def lease_name(instance_id: str) -> str:
    return object_name(instance_id, "lease")


def list_objects(instance_id: str | None = None) -> tuple[list[str], list[str]]:
    """(segment names, semaphore names) under our prefix, of one instance or of all."""
    stem = f"{PREFIX}-{check_instance_id(instance_id)}-" if instance_id else f"{PREFIX}-"
    segments, semaphores = [], []
    try:
        entries = os.listdir(DEV_SHM)
    except FileNotFoundError:
        return segments, semaphores
    for entry in entries:
        if entry.startswith(stem):
            segments.append("/" + entry)
        elif entry.startswith("sem." + stem):
            semaphores.append("/" + entry[4:])
    return sorted(segments), sorted(semaphores)


def _instance_of(name: str) -> str | None:
    rest = name[len(PREFIX) + 2 :] if name.startswith(f"/{PREFIX}-") else ""
    instance_id = rest.split("-", 1)[0]
    return instance_id if _INSTANCE_RE.match(instance_id or "-") else None


def read_lease(instance_id: str) -> tuple[int, float] | None:
    """(pid, start time) recorded in the instance's lease, or None if absent or unreadable."""
    try:
        shm = posix_ipc.SharedMemory(lease_name(instance_id))
    except posix_ipc.ExistentialError:
        return None
    try:
        if shm.size < _LEASE_BYTES:
            return None
        with mmap.mmap(shm.fd, _LEASE_BYTES, prot=mmap.PROT_READ) as mm:
            view = memoryview(mm)
            try:
                magic, pid = view[:16].cast("Q")
                started = view[16:24].cast("d")[0]
            finally:
                view.release()
    finally:
        shm.close_fd()
    return (pid, started) if magic == _LEASE_MAGIC else None


def instance_is_live(instance_id: str) -> bool:
    lease = read_lease(instance_id)
    return lease is not None and liveness.is_alive(*lease)


def _unlink_all(segments: list[str], semaphores: list[str]) -> list[str]:
    removed = []
    for name in semaphores:
        if unlink_semaphore(name):
            removed.append(name)
    for name in segments:
        if unlink_segment(name):
            removed.append(name)
    return removed


def remove_leftovers(instance_id: str) -> list[str]:
    """Remove every object of `instance_id` unless it is live (then raise InstanceBusy)."""
    if instance_is_live(instance_id):
        raise InstanceBusy(f"instance {instance_id!r} is held by live pid {read_lease(instance_id)[0]}")
    segments, semaphores = list_objects(instance_id)
    lease = lease_name(instance_id)
    others = [name for name in segments if name != lease]
    # Lease last, mirroring a clean shutdown, so a concurrent sweeper sees a consistent story.
    return _unlink_all(others, semaphores) + _unlink_all([lease] if lease in segments else [], [])


def sweep_dead_instances(id_prefix: str = "") -> list[str]:
    """Machine-wide: remove objects of every instance (whose id starts with `id_prefix`)
    whose lease is missing or names a dead process."""
    segments, semaphores = list_objects()
    instances = {_instance_of(name) for name in segments + semaphores} - {None}
    instances = {instance_id for instance_id in instances if instance_id.startswith(id_prefix)}
    removed = []
    for instance_id in sorted(instances):
        if not instance_is_live(instance_id):
            removed += remove_leftovers(instance_id)
    return removed


@dataclass
class Instance:
    """The supervisor's handle: holds the lease and creates/unlinks the instance's objects."""

    instance_id: str
    created: list[str] = field(default_factory=list)  # segments, in creation order
    semaphores: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, instance_id: str) -> "Instance":
        """Clear a crashed run's leftovers of this instance, then take its lease.

        Raises InstanceBusy if another live process holds the instance.
        """
        remove_leftovers(instance_id)
        name = lease_name(instance_id)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=_LEASE_BYTES)
        except posix_ipc.ExistentialError as exc:
            raise InstanceBusy(f"instance {instance_id!r} was taken concurrently") from exc
        try:
            with mmap.mmap(shm.fd, _LEASE_BYTES) as mm:
                view = memoryview(mm)
                pid, started = liveness.my_identity()
                view[8:16].cast("Q")[0] = pid
                view[16:24].cast("d")[0] = started
                view[:8].cast("Q")[0] = _LEASE_MAGIC
                view.release()
        finally:
            shm.close_fd()
        return cls(instance_id)

    def name(self, what: str) -> str:
        return object_name(self.instance_id, what)

    def create_ring(self, name: str, config: RingConfig = RingConfig()) -> str:
        """Create a ring segment (full POSIX name from the naming helpers); returns the name."""
        self._check_mine(name)
        create_ring(name, config)
        self.created.append(name)
        return name

    def create_semaphore_doorbell(self, name: str) -> SemaphoreDoorbell:
        self._check_mine(name)
        bell = SemaphoreDoorbell(name, create=True)
        self.semaphores.append(name)
        return bell

    def _check_mine(self, name: str) -> None:
        if not name.startswith(f"/{PREFIX}-{self.instance_id}-"):
            raise ValueError(f"{name!r} is not a name of instance {self.instance_id!r}")

    def shutdown(self) -> list[str]:
        """Unlink everything of this instance (also objects others created under its name),
        lease last. Open mappings in children keep working until they unmap."""
        segments, semaphores = list_objects(self.instance_id)
        lease = lease_name(self.instance_id)
        removed = _unlink_all([n for n in segments if n != lease], semaphores)
        removed += _unlink_all([lease] if lease in segments else [], [])
        self.created.clear()
        self.semaphores.clear()
        return removed

    def __enter__(self) -> "Instance":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
