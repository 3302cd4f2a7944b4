"""The cluster's description and the partitions' producers: DescribeCluster and DescribeProducers, answered by
the worker from what it holds (the node's own address and id; each partition's producer state, read from its
log under the partition's lock).

Invariants:
- DescribeCluster needs no permission; its cluster_authorized_operations are the principal's (0 without DESCRIBE
  on the cluster). DescribeProducers needs READ on each topic (TOPIC_AUTHORIZATION_FAILED on its partitions).
- The node is the cluster's one broker and its controller; DescribeCluster v1 for controllers (endpoint type 2)
  is UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker answers it.
- DescribeQuorum (kafka-metadata-quorum) describes the metadata log Kafka's KRaft controllers keep,
  `__cluster_metadata` partition 0; the node is its one voter and leader, with no observers, no follower and so
  no lag. Its leader epoch is 1 (leadership never moves) and its high watermark and log end offset the catalog's
  version (the count of metadata changes, which the node keeps in its catalog file, not in a log). The voter's
  directory id is fixed by the cluster id and node id. It needs DESCRIBE on the cluster, as Kafka's; another
  partition is UNKNOWN_TOPIC_OR_PARTITION.
- DescribeProducers lists every producer a partition's state keeps (the newest batches of each, within
  producer ids' expiry): its epoch, last sequence and timestamp, and the first offset of its open transaction
  (-1 when none). An unknown topic or partition is UNKNOWN_TOPIC_OR_PARTITION; a disk fault its storage error.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Callable

from kio.static.primitive import i8, i32, i64, u16

from shmbroker.node.config import NodeConfig
from shmbroker.node.storage.faults import storage_faults
from shmbroker.node.storage.records import StorageError
from shmbroker.node.storage.store import PartitionStore
from shmbroker.node.storage.acls import CLUSTER_NAME, Operation, ResourceType
from shmbroker.workers.api.responses import NOT_REQUESTED, ZERO_THROTTLE, code, entity, reply
from shmbroker.workers.codecs import errors as E
from shmbroker.workers.codecs import protocol as P
from shmbroker.workers.connection import Request
from shmbroker.workers.timer_client.outcome import Outcome
from shmbroker.workers.api.authorizer import RequestAuthorizer
from shmbroker.workers.api.family import HandlerFamily

BROKER_ENDPOINTS = 1  # DescribeCluster v1's endpoint_type: brokers (2: controllers)
NO_COORDINATOR_EPOCH = -1  # markers here carry no coordinator epoch (one coordinator, never moved)
METADATA_TOPIC = "__cluster_metadata"  # KRaft's metadata log, which DescribeQuorum describes
METADATA_PARTITION = 0
QUORUM_LEADER_EPOCH = 1


class ClusterHandlers(HandlerFamily):
    def __init__(self, partitions: PartitionStore, config: NodeConfig, cluster_id: str,
                 authorizer: RequestAuthorizer | None = None) -> None:
        super().__init__(config, authorizer=authorizer)
        self.partitions = partitions
        self.cluster_id = cluster_id

    def table(self) -> dict[int, Callable[[Request, Any], Outcome]]:
        return {P.DESCRIBE_CLUSTER: self.describe_cluster, P.DESCRIBE_PRODUCERS: self.describe_producers,
                P.DESCRIBE_QUORUM: self.describe_quorum}

    def describe_cluster(self, req: Request, request: Any) -> Outcome:
        server = self.config.server
        node_id = server.node_id
        endpoint_type = int(getattr(request, "endpoint_type", BROKER_ENDPOINTS))
        if endpoint_type != BROKER_ENDPOINTS:
            return reply(req, entity(req, "DescribeClusterResponse", throttle_time=ZERO_THROTTLE,
                                     error_code=E.ErrorCode.unsupported_endpoint_type,
                                     error_message=f"The node has no endpoints of type {endpoint_type}; "
                                                   "it is a broker, ask for brokers (1).",
                                     endpoint_type=i8(endpoint_type), cluster_id=self.cluster_id,
                                     controller_id=i32(-1), brokers=(),
                                     cluster_authorized_operations=i32(NOT_REQUESTED)))
        broker = entity(req, "DescribeClusterBroker", broker_id=i32(node_id),
                        host=server.advertised_host or server.host, port=i32(server.advertised_port or server.port),
                        rack=None, is_fenced=False)  # v2: a node is never fenced (it is its own controller)
        return reply(req, entity(req, "DescribeClusterResponse", throttle_time=ZERO_THROTTLE, error_code=E.NONE,
                                 error_message=None, endpoint_type=i8(endpoint_type), cluster_id=self.cluster_id,
                                 controller_id=i32(node_id), brokers=(broker,),
                                 cluster_authorized_operations=i32(self.authorizer.cluster_operations(
                                     req, request.include_cluster_authorized_operations))))

    def describe_quorum(self, req: Request, request: Any) -> Outcome:
        if not self.authorizer.allows(req, Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
            return reply(req, entity(req, "DescribeQuorumResponse", error_code=E.CLUSTER_AUTHORIZATION_FAILED,
                                     error_message=None, topics=(), nodes=()))
        server = self.config.server
        node_id = server.node_id
        end = i64(self.partitions.catalog.version)
        voter = entity(req, "ReplicaState", replica_id=i32(node_id),
                       replica_directory_id=uuid.uuid5(uuid.NAMESPACE_OID, f"{self.cluster_id}/{node_id}"),
                       log_end_offset=end, last_fetch_timestamp=i64(-1),  # -1: the leader's own (Kafka's)
                       last_caught_up_timestamp=i64(int(time.time() * 1000)))
        topics = []
        for topic in request.topics:
            partitions = []
            for part in topic.partitions:
                index = int(part.partition_index)
                if topic.topic_name != METADATA_TOPIC or index != METADATA_PARTITION:
                    partitions.append(entity(req, "PartitionData", partition_index=i32(index),
                                             error_code=E.UNKNOWN_TOPIC_OR_PARTITION, error_message=None,
                                             leader_id=i32(-1), leader_epoch=i32(-1), high_watermark=i64(-1),
                                             current_voters=(), observers=()))
                    continue
                partitions.append(entity(req, "PartitionData", partition_index=i32(index), error_code=E.NONE,
                                         error_message=None, leader_id=i32(node_id),
                                         leader_epoch=i32(QUORUM_LEADER_EPOCH), high_watermark=end,
                                         current_voters=(voter,), observers=()))
            topics.append(entity(req, "TopicData", topic_name=topic.topic_name, partitions=tuple(partitions)))
        listener = entity(req, "Listener", name=self.config.listener_list()[0].name,
                          host=server.advertised_host or server.host, port=u16(server.advertised_port or server.port))
        node = entity(req, "Node", node_id=i32(node_id), listeners=(listener,))
        return reply(req, entity(req, "DescribeQuorumResponse", error_code=E.NONE, error_message=None,
                                 topics=tuple(topics), nodes=(node,)))

    def describe_producers(self, req: Request, request: Any) -> Outcome:
        checking = self.authorizer.enabled
        topics = []
        for topic in request.topics:
            refused = checking and not self.authorizer.allows(req, Operation.READ, ResourceType.TOPIC, topic.name)
            topics.append(entity(req, "TopicResponse", name=topic.name, partitions=tuple(
                self._partition_producers(req, topic.name, int(partition), refused)
                for partition in topic.partition_indexes)))
        return reply(req, entity(req, "DescribeProducersResponse", throttle_time=ZERO_THROTTLE, topics=tuple(topics)))

    def _partition_producers(self, req: Request, topic: str, partition: int, refused: bool) -> Any:
        if refused:
            return entity(req, "PartitionResponse", partition_index=i32(partition),
                          error_code=E.TOPIC_AUTHORIZATION_FAILED, error_message=None, active_producers=())
        row = self.partitions.row(topic, partition)
        if row is None:
            return entity(req, "PartitionResponse", partition_index=i32(partition),
                          error_code=E.UNKNOWN_TOPIC_OR_PARTITION, error_message=None, active_producers=())
        try:
            with storage_faults(f"producer state of {topic}-{partition}"):
                producers = self.partitions.log(row).active_producers()
        except StorageError as exc:
            return entity(req, "PartitionResponse", partition_index=i32(partition), error_code=code(exc.error_code),
                          error_message=str(exc), active_producers=())
        return entity(req, "PartitionResponse", partition_index=i32(partition), error_code=E.NONE,
                      error_message=None, active_producers=tuple(
                          entity(req, "ProducerState", producer_id=i64(producer_id), producer_epoch=i32(entry.epoch),
                                 last_sequence=i32(entry.last_sequence), last_timestamp=i64(entry.last_timestamp),
                                 coordinator_epoch=i32(NO_COORDINATOR_EPOCH),
                                 current_txn_start_offset=i64(entry.open_transaction_from))
                          for producer_id, entry in producers))
