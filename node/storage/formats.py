"""The format versions of everything a data directory keeps, and the check a node makes of them before it
writes anything there (the part Kafka's meta.properties and its record and checkpoint versions play).

Every kind of file has a format version. A JSON document carries its own (FILE_VERSIONS: the field and the
newest version this node writes); the binary files and the internal logs' records carry none of their own,
and `format.json`, the directory's, names theirs:

    directory format 2 (format.json {"format": 2, "written_by": "shmbroker X"})
      <topic>-<p>/<base>.log                 Kafka record batches, magic 2, as clients send them
      <topic>-<p>/<base>.index               entries (relative offset u32, position u32), little-endian
      <topic>-<p>/<base>.timeindex           entries (timestamp i64, relative offset i64), little-endian
      <topic>-<p>/<base>.txnindex            34-byte aborted-transaction entries, each led by its version (0)
      <topic>-<p>/log-start-offset           DeleteRecords' log start, decimal text
      <topic>-<p>/cleaner-offset-checkpoint  how far the log cleaner cleaned, decimal text
      <topic>-<p>/cleaning/swap.json         the log cleaner's swap manifest: [[new base, [old bases]], ...]
      producer_ids                           the next producer id, decimal text
      __consumer_offsets records             key [group, topic, partition], value [clock, offset, epoch,
                                             metadata, commit ms] (node.timer.groups.offsets)
      __transaction_state records            key [transactional id], value the transaction's metadata
                                             (node.timer.transactions.metadata)
    directory format 1: no format.json (every node before format versions); the same layouts as 2.

A node reads every older version any node wrote: `check` lists what `upgrade` converts (each conversion is
one log line), and raises NewerFormat, naming the file and both versions, for a version newer than this
node's. `check` only reads, so a refused directory is left exactly as it was; the supervisor calls it before
it takes the directory's lock. Converting rewrites each file whole and atomically, the directory's format
file last, so a crash in the middle leaves a directory that converts again.

Invariants: a node never writes a file of a format newer than it knows; after `upgrade` the directory's and
every versioned document's format are this node's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from importlib import metadata

import orjson

from shmbroker.node.storage.durable import write_durably

log = logging.getLogger("shmbroker.formats")

FORMAT_FILE = "format.json"
DIRECTORY_FORMAT = 2
# The versioned documents at the directory's top: file -> (the field holding the version, the newest version
# this node writes). A document without the field is version 1 (written before it had one).
CATALOG_FORMAT = 2  # 1: no "format" field (the same document otherwise)
ACLS_FORMAT = 1
USERS_FORMAT = 1
FILE_VERSIONS = {
    "catalog.json": ("format", CATALOG_FORMAT),
    "acls.json": ("version", ACLS_FORMAT),
    "users.json": ("version", USERS_FORMAT),
}
PRODUCER_SNAPSHOT_FORMAT = 2  # node.storage.producer_state: 1 had no "format" field


class FormatError(ValueError):
    """A file whose format version this node cannot read."""


class NewerFormat(FormatError):
    """A file of a format this node does not know: written by a newer node."""

    def __init__(self, path: str, found: int, known: int, written_by: str = "") -> None:
        by = f", written by {written_by}" if written_by else ""
        super().__init__(f"{path} is format {found}{by}; this node ({node_version()}) reads formats up to "
                         f"{known}: start the newer version of shmbroker on it (the files are left as they are)")
        self.path, self.found, self.known = path, found, known


def node_version() -> str:
    try:
        return f"shmbroker {metadata.version('shmbroker')}"
    except metadata.PackageNotFoundError:
        return "shmbroker (not installed)"


def version_of(document: object, path: str, field: str, known: int) -> int:
    """The format version a document states (1 without one); NewerFormat if it is newer than `known`."""
    version = document.get(field, 1) if isinstance(document, dict) else 1
    if not isinstance(version, int) or version < 1:
        raise FormatError(f"{path}: {field} {version!r} is not a format version")
    if version > known:
        raise NewerFormat(path, version, known, str(document.get("written_by", "")))
    return version


@dataclass(frozen=True)
class Conversion:
    """An older file `upgrade` brings to this node's format."""

    path: str
    found: int
    wanted: int


def check(data_dir: str) -> list[Conversion]:
    """What `upgrade` must convert; NewerFormat for anything newer than this node knows. Reads only."""
    conversions = []
    path = os.path.join(data_dir, FORMAT_FILE)
    document = _read(path)
    if document is not None:
        found = version_of(document, path, "format", DIRECTORY_FORMAT)
    else:  # a new directory, or one written before format versions: is there anything in it?
        found = 1 if os.path.isdir(data_dir) and any(name != ".lock" for name in os.listdir(data_dir)) else 0
    if found < DIRECTORY_FORMAT:
        conversions.append(Conversion(path, found, DIRECTORY_FORMAT))
    for name, (field, known) in FILE_VERSIONS.items():
        path = os.path.join(data_dir, name)
        document = _read(path)
        if document is not None and (found := version_of(document, path, field, known)) < known:
            conversions.append(Conversion(path, found, known))
    return conversions


def _stamped(field: str, version: int):
    """The conversion of a document whose next version only names its version (the layout is the same)."""
    return lambda document: {field: version, **{k: v for k, v in document.items() if k != field}}


# file -> {version: the conversion of a document of that version into the next}
CONVERSIONS = {"catalog.json": {1: _stamped("format", 2)}}


def upgrade(data_dir: str, conversions: list[Conversion]) -> None:
    """Convert what `check` listed, the directory's format file last (it says every other file is converted).
    A document is rewritten whole, atomically (write_durably), so a crash leaves the old version or the new."""
    by_name = {os.path.basename(c.path): c for c in conversions}
    for name, steps in CONVERSIONS.items():
        conversion = by_name.get(name)
        if conversion is None:
            continue
        document = _read(conversion.path)
        for version in range(conversion.found, conversion.wanted):
            document = steps[version](document)
        write_durably(conversion.path, orjson.dumps(document), mode=os.stat(conversion.path).st_mode & 0o777)
        log.info("converted %s from format %d to %d", conversion.path, conversion.found, conversion.wanted)
    directory = by_name.get(FORMAT_FILE)
    if directory is not None:
        os.makedirs(data_dir, exist_ok=True)
        write_durably(os.path.join(data_dir, FORMAT_FILE),
                      orjson.dumps({"format": DIRECTORY_FORMAT, "written_by": node_version()}))
        if directory.found:
            log.info("converted the data directory %s from format %d to %d", data_dir, directory.found,
                     directory.wanted)


def _read(path: str) -> dict | None:
    try:
        with open(path, "rb") as file:
            document = orjson.loads(file.read())
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError as exc:
        raise FormatError(f"{path}: not JSON ({exc})") from None
    if not isinstance(document, dict):
        raise FormatError(f"{path}: not a JSON object")
    return document
