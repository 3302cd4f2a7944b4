"""Today's node on data directories that earlier versions of the node wrote (tests/upgrade/fixtures, made by
make_fixture.py): it starts, and every record, committed offset, transaction outcome, producer state, topic
config, ACL and user the workload stored is there; a directory of a newer format than it knows is refused
with both versions named, and left as it was."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from scripts.harness import rawkafka
from shmbroker.node.tools.cli import EXIT_NEWER_FORMAT
from scripts.harness.nodeproc import NodeProcess
from tests.upgrade import workload

pytestmark = pytest.mark.node

FIXTURES = sorted(Path(__file__).resolve().parent.joinpath("fixtures").iterdir())


def unpack(fixture: Path, into: Path) -> tuple[Path, str, dict]:
    with tarfile.open(fixture / "data.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "data", (into / "node.toml").read_text(), json.loads((fixture / "manifest.json").read_text())


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root with a digest of its bytes and its mode (a refused start must change neither)."""
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found[str(path.relative_to(root))] = f"{digest} {path.stat().st_mode:o}"
    return found


def resend(node: NodeProcess, duplicate: dict) -> tuple[int, int]:
    """Send the workload's last idempotent batch again: (the offset it is answered with, the log end after)."""
    with rawkafka.RawConnection("127.0.0.1", node.port) as conn:
        offset = workload.produce(conn, base64.b64decode(duplicate["batch"]))
        ends = conn.call(rawkafka.LIST_OFFSETS, 5, rawkafka.list_offsets_body({workload.ORDERS: [1]}))
    return offset, int(ends.topics[0].partitions[0].offset)


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f.name for f in FIXTURES])
@pytest.mark.parametrize("workers", [1, 2])
def test_todays_node_starts_on_a_data_directory_an_earlier_version_wrote(fixture, workers, tmp_path) -> None:
    data_dir, config, manifest = unpack(fixture, tmp_path)
    features = set(manifest["features"])
    (tmp_path / "run").mkdir()
    node = NodeProcess(tmp_path / "run", workers=workers, config=config, data_dir=data_dir)
    with node:
        assert workload.read_everything(node.bootstrap) == manifest["records"]
        assert workload.state(node.bootstrap, features, manifest["topic_configs"]) == manifest["state"]
        before = manifest["records"]["orders/1"]["last"] + 1
        assert resend(node, manifest["duplicate"]) == (manifest["duplicate"]["base_offset"], before)
        code = node.stop()
        assert code == 0, node.log()
        # Started again on what it converted: the same answers.
        node.start()
        assert workload.read_everything(node.bootstrap) == manifest["records"]
        assert workload.state(node.bootstrap, features, manifest["topic_configs"]) == manifest["state"]
    assert "Traceback" not in node.log(), node.log()


NEWER = {  # file -> the field that holds its version
    "format.json": "format",
    "catalog.json": "format",
    "acls.json": "version",
    "users.json": "version",
}


@pytest.mark.parametrize("name", sorted(NEWER))
def test_a_data_directory_of_a_newer_format_is_refused_and_left_as_it_was(name, tmp_path) -> None:
    data_dir, config, manifest = unpack(FIXTURES[-1], tmp_path)
    (tmp_path / "run").mkdir()
    node = NodeProcess(tmp_path / "run", config=config, data_dir=data_dir)
    with node:  # today's node converts the directory to its own format first
        pass
    path = data_dir / name
    document = json.loads(path.read_text())
    known = document.get(NEWER[name], 1)
    document[NEWER[name]] = known + 1
    document["written_by"] = "shmbroker 99.0"
    path.write_text(json.dumps(document))
    before = tree_digest(data_dir)
    (tmp_path / "again").mkdir()
    refused = NodeProcess(tmp_path / "again", config=config, data_dir=data_dir)
    try:
        with pytest.raises(RuntimeError, match=f"node exited with {EXIT_NEWER_FORMAT}"):
            refused.start()
    finally:
        refused.close()
    message = refused.log().strip().splitlines()[-1]
    assert f"{path} is format {known + 1}, written by shmbroker 99.0" in message, refused.log()
    assert f"reads formats up to {known}" in message, refused.log()
    assert "Traceback" not in refused.log(), refused.log()
    assert tree_digest(data_dir) == before


def test_a_node_restarted_with_other_settings_for_its_internal_logs_starts(tmp_path) -> None:
    """The timer sets the configs of __consumer_offsets and __transaction_state from the node's config at every
    start; a changed setting (or a directory from before the offsets log had configs) must not stop it."""
    settings = "[groups]\noffsets_segment_bytes = {0}\n[transactions]\nstate_segment_bytes = {0}\n"
    node = NodeProcess(tmp_path, config=settings.format(1 << 20))
    with node:
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        admin.create_topics([NewTopic("t", 1, 1)])["t"].result(workload.TIMEOUT_S)
        producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "t"})
        producer.init_transactions(workload.TIMEOUT_S)
        consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g"})
        consumer.commit(offsets=[TopicPartition("t", 0, 7)], asynchronous=False)
        consumer.close()
        assert node.stop() == 0, node.log()
        node.config_path.write_text(settings.format(2 << 20))
        node.start()
        consumer = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "g"})
        assert consumer.committed([TopicPartition("t", 0)], workload.TIMEOUT_S)[0].offset == 7
        consumer.close()
        producer = Producer({"bootstrap.servers": node.bootstrap, "transactional.id": "t"})
        producer.init_transactions(workload.TIMEOUT_S)
    assert "Traceback" not in node.log(), node.log()


def test_a_format_file_that_does_not_parse_is_refused_with_its_name(tmp_path) -> None:
    data_dir, config, _ = unpack(FIXTURES[-1], tmp_path)
    (data_dir / "format.json").write_text('{"format": ')
    before = tree_digest(data_dir)
    (tmp_path / "run").mkdir()
    refused = NodeProcess(tmp_path / "run", config=config, data_dir=data_dir)
    try:
        with pytest.raises(RuntimeError, match="node exited with 1"):
            refused.start()
    finally:
        refused.close()
    assert f"cannot start: {data_dir / 'format.json'}: not JSON" in refused.log(), refused.log()
    assert "Traceback" not in refused.log(), refused.log()
    assert tree_digest(data_dir) == before
