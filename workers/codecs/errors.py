"""Kafka error codes and the one exception the protocol layer raises.

Invariants:
- Every error code a handler puts on the wire is a member of kio's ``ErrorCode``
  (generated from Kafka's own error table), so numbers are never typed by hand.
  The module-level names below are the ones this broker uses; any other code is
  reachable as ``ErrorCode.<name>``.
- ``ProtocolError`` is the only exception that decoding or framing raises on
  malformed input. A worker that catches it closes that one connection and
  logs one line; it never means the process is in trouble.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


class ProtocolError(Exception):
    """Input that cannot be parsed as the Kafka protocol (or a message we cannot encode)."""


NONE = ErrorCode.none
UNKNOWN_SERVER_ERROR = ErrorCode.unknown_server_error
OFFSET_OUT_OF_RANGE = ErrorCode.offset_out_of_range
CORRUPT_MESSAGE = ErrorCode.corrupt_message
UNKNOWN_TOPIC_OR_PARTITION = ErrorCode.unknown_topic_or_partition
INVALID_FETCH_SIZE = ErrorCode.invalid_fetch_size
LEADER_NOT_AVAILABLE = ErrorCode.leader_not_available
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower
REQUEST_TIMED_OUT = ErrorCode.request_timed_out
MESSAGE_TOO_LARGE = ErrorCode.message_too_large
INVALID_TOPIC_EXCEPTION = ErrorCode.invalid_topic_exception
RECORD_LIST_TOO_LARGE = ErrorCode.record_list_too_large
INVALID_REQUIRED_ACKS = ErrorCode.invalid_required_acks
INVALID_TIMESTAMP = ErrorCode.invalid_timestamp
UNSUPPORTED_VERSION = ErrorCode.unsupported_version
TOPIC_ALREADY_EXISTS = ErrorCode.topic_already_exists
INVALID_PARTITIONS = ErrorCode.invalid_partitions
INVALID_REPLICATION_FACTOR = ErrorCode.invalid_replication_factor
INVALID_CONFIG = ErrorCode.invalid_config
INVALID_REQUEST = ErrorCode.invalid_request
POLICY_VIOLATION = ErrorCode.policy_violation
OUT_OF_ORDER_SEQUENCE_NUMBER = ErrorCode.out_of_order_sequence_number
DUPLICATE_SEQUENCE_NUMBER = ErrorCode.duplicate_sequence_number
INVALID_PRODUCER_EPOCH = ErrorCode.invalid_producer_epoch
UNKNOWN_PRODUCER_ID = ErrorCode.unknown_producer_id
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = ErrorCode.transactional_id_authorization_failed
CLUSTER_AUTHORIZATION_FAILED = ErrorCode.cluster_authorization_failed
TOPIC_AUTHORIZATION_FAILED = ErrorCode.topic_authorization_failed
GROUP_AUTHORIZATION_FAILED = ErrorCode.group_authorization_failed
GROUP_ID_NOT_FOUND = ErrorCode.group_id_not_found
SECURITY_DISABLED = ErrorCode.security_disabled
UNACCEPTABLE_CREDENTIAL = ErrorCode.unacceptable_credential
DUPLICATE_RESOURCE = ErrorCode.duplicate_resource
RESOURCE_NOT_FOUND = ErrorCode.resource_not_found
UNSUPPORTED_SASL_MECHANISM = ErrorCode.unsupported_sasl_mechanism
INVALID_RECORD = ErrorCode.invalid_record
FETCH_SESSION_ID_NOT_FOUND = ErrorCode.fetch_session_id_not_found
INVALID_FETCH_SESSION_EPOCH = ErrorCode.invalid_fetch_session_epoch
FETCH_SESSION_TOPIC_ID_ERROR = ErrorCode.fetch_session_topic_id_error
UNKNOWN_TOPIC_ID = ErrorCode.unknown_topic_id

__all__ = [
    "UNKNOWN_TOPIC_ID",
    "ErrorCode",
    "ProtocolError",
    "NONE",
    "UNKNOWN_SERVER_ERROR",
    "OFFSET_OUT_OF_RANGE",
    "CORRUPT_MESSAGE",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "INVALID_FETCH_SIZE",
    "LEADER_NOT_AVAILABLE",
    "NOT_LEADER_OR_FOLLOWER",
    "REQUEST_TIMED_OUT",
    "MESSAGE_TOO_LARGE",
    "INVALID_TOPIC_EXCEPTION",
    "RECORD_LIST_TOO_LARGE",
    "INVALID_REQUIRED_ACKS",
    "INVALID_TIMESTAMP",
    "UNSUPPORTED_VERSION",
    "TOPIC_ALREADY_EXISTS",
    "INVALID_PARTITIONS",
    "INVALID_REPLICATION_FACTOR",
    "INVALID_CONFIG",
    "INVALID_REQUEST",
    "POLICY_VIOLATION",
    "OUT_OF_ORDER_SEQUENCE_NUMBER",
    "DUPLICATE_SEQUENCE_NUMBER",
    "INVALID_PRODUCER_EPOCH",
    "UNKNOWN_PRODUCER_ID",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "CLUSTER_AUTHORIZATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "GROUP_ID_NOT_FOUND",
    "SECURITY_DISABLED",
    "UNACCEPTABLE_CREDENTIAL",
    "DUPLICATE_RESOURCE",
    "RESOURCE_NOT_FOUND",
    "UNSUPPORTED_SASL_MECHANISM",
    "INVALID_RECORD",
    "FETCH_SESSION_ID_NOT_FOUND",
    "INVALID_FETCH_SESSION_EPOCH",
    "FETCH_SESSION_TOPIC_ID_ERROR",
]
