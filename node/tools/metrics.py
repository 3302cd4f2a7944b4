"""The Prometheus endpoint (`shmbroker serve --metrics HOST:PORT`): the stats segment as metrics, served by
prometheus-client from a thread of the supervisor.

Names follow Kafka's JMX metrics where Kafka has one (kafka_network_requests_total{request="Produce"} for
kafka.network:type=RequestMetrics,name=RequestsPerSec; kafka_server_delayed_operations{purgatory="fetch"} for
DelayedOperationPurgatory PurgatorySize; kafka_log_log_end_offset{topic,partition} for Log LogEndOffset); every
other field of shm.stats is exported as shmbroker_<field> with the process as labels (transactions open,
committed, aborted, timed out: shmbroker_transactions_*), the LSO lag per partition as
kafka_cluster_partition_last_stable_offset_lag, the longest open transaction's age as
shmbroker_transactions_oldest_open_ms.

Invariants: each scrape reads one fresh snapshot (no caching between scrapes, nothing written to the node); the
endpoint listens on loopback unless told otherwise; it is off by default.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry
from prometheus_client import start_http_server

from shmbroker.node.tools.inspect import OPEN_STATES, NodeReader, api_name, error_name, locate, named_counts
from shmbroker.shm import stats as S

_PER_API = {"requests": ("kafka_network_requests", "Requests read, per API (RequestsPerSec)"),
            "request_errors": ("kafka_network_request_errors", "Requests that closed their connection, per API"),
            "error_responses": ("kafka_network_error_responses", "Responses carrying an error code, per API"),
            "bytes_in": ("kafka_network_request_bytes", "Request bytes read, per API"),
            "bytes_out": ("kafka_network_response_bytes", "Response bytes queued, per API"),
            "authorization_denials": ("kafka_security_authorizer_denials",
                                      "Operations the authorizer refused, per API")}
_KAFKA_NAMES = {"connections": "kafka_server_connections", "rebalances": "kafka_coordinator_group_rebalances",
                "groups": "kafka_coordinator_groups", "group_members": "kafka_coordinator_group_members",
                "flushes": "kafka_log_flushes", "bytes_flushed": "kafka_log_flushed_bytes",
                "throttled_clients": "kafka_server_quota_throttled_clients",
                "throttle_ms_total": "kafka_server_quota_throttle_time_ms"}


class StatsCollector:
    def __init__(self, reader: NodeReader) -> None:
        self.reader = reader

    def collect(self):
        rows = self.reader.rows()
        per_api = {name: CounterMetricFamily(metric, text, labels=["request", "worker"])
                   for name, (metric, text) in _PER_API.items()}
        for row in rows:
            if row.role != "worker":
                continue
            for name, family in per_api.items():
                for api, value in named_counts(row, name, api_name):
                    family.add_metric([api, str(row.index)], value)
        yield from per_api.values()
        errors = CounterMetricFamily("kafka_network_errors", "Error codes in responses, per Kafka error (ErrorsPerSec)",
                                     labels=["error", "worker"])
        for row in rows:
            if row.role == "worker":
                for error, value in named_counts(row, "error_codes", error_name):
                    errors.add_metric([error, str(row.index)], value)
        yield errors
        logins = CounterMetricFamily("kafka_server_sasl_logins", "SASL logins that succeeded, per listener and mechanism",
                                     labels=["listener", "mechanism"])
        failures = CounterMetricFamily("kafka_server_sasl_login_failures",
                                       "SASL logins refused, per listener and mechanism", labels=["listener", "mechanism"])
        for entry in self.reader.sasl_logins(rows):
            logins.add_metric([entry["listener"], entry["mechanism"]], entry["logins"])
            failures.add_metric([entry["listener"], entry["mechanism"]], entry["failures"])
        yield logins
        yield failures
        denials = CounterMetricFamily("kafka_security_authorizer_principal_denials",
                                      "Operations the authorizer refused, per principal and API",
                                      labels=["principal", "request"])
        for entry in self.reader.denials_by_principal(rows):
            denials.add_metric([entry["principal"], entry["api"]], entry["denials"])
        yield denials
        purgatory = GaugeMetricFamily("kafka_server_delayed_operations", "Delayed operations waiting (PurgatorySize)",
                                      labels=["purgatory"])
        for field in S.FIELDS:
            if field.width != 1 or field.name == "published_ms":
                continue
            metric = _KAFKA_NAMES.get(field.name, f"shmbroker_{field.name}")
            if field.counter:
                metric = metric[:-len("_total")] if metric.endswith("_total") else metric
                family = CounterMetricFamily(metric, field.help, labels=["process", "index"])
            else:
                family = GaugeMetricFamily(metric, field.help, labels=["process", "index"])
            for row in rows:
                family.add_metric([row.role, str(row.index)], row.get(field.name))
            yield family
            if field.name.startswith("purgatory_") and field.name.endswith("_pending"):
                timer = next((row for row in rows if row.role == "timer"), None)
                if timer is not None:
                    purgatory.add_metric([field.name.split("_")[1]], timer.get(field.name))
        yield purgatory
        ring_used = GaugeMetricFamily("shmbroker_ring_used_bytes", "Bytes in a ring not yet consumed",
                                      labels=["ring", "worker"])
        for row in rows:
            if row.role == "worker":
                ring_used.add_metric(["request", str(row.index)], int(row.array("ring_used_bytes")[0]))
            elif row.role == "timer":
                for worker, value in enumerate(row.array("ring_used_bytes").tolist()):
                    if row.array("ring_capacity_bytes")[worker]:
                        ring_used.add_metric(["completion", str(worker)], value)
        yield ring_used
        collections = CounterMetricFamily("shmbroker_gc_collections", "Garbage collections, per generation",
                                          labels=["process", "index", "generation"])
        for row in rows:
            for generation, value in enumerate(row.array("gc_collections").tolist()):
                collections.add_metric([row.role, str(row.index), str(generation)], value)
        yield collections
        wheel = GaugeMetricFamily("shmbroker_wheel_entries_by_level", "Pending timer entries held at each wheel level",
                                  labels=["level"])
        for row in rows:
            if row.role == "timer":
                for level, value in enumerate(row.array("wheel_entries_by_level")[:max(1, row.get("wheel_levels"))]):
                    wheel.add_metric([str(level)], int(value))
        yield wheel
        end = GaugeMetricFamily("kafka_log_log_end_offset", "Log end offset", labels=["topic", "partition"])
        start = GaugeMetricFamily("kafka_log_log_start_offset", "Log start offset", labels=["topic", "partition"])
        high = GaugeMetricFamily("kafka_cluster_partition_high_watermark", "High watermark",
                                 labels=["topic", "partition"])
        stable = GaugeMetricFamily("kafka_cluster_partition_last_stable_offset_lag",
                                   "High watermark minus the last stable offset (records in open transactions)",
                                   labels=["topic", "partition"])
        # The log cleaner's figures per compacted partition (Kafka's LogCleanerManager has them per log directory).
        cleaning = {
            "dirty_ratio": GaugeMetricFamily("kafka_log_cleaner_dirty_ratio",
                                             "Uncleaned share of a compacted log's cleanable bytes",
                                             labels=["topic", "partition"]),
            "lag_ms": GaugeMetricFamily("kafka_log_cleaner_compaction_delay_ms",
                                        "Age of the oldest uncleaned record", labels=["topic", "partition"]),
            "last_run_ms": GaugeMetricFamily("kafka_log_cleaner_last_run_timestamp_ms",
                                             "Wall-clock ms the last cleaning ended", labels=["topic", "partition"]),
            "bytes_cleaned": CounterMetricFamily("kafka_log_cleaner_bytes_cleaned", "Log bytes cleanings read",
                                                 labels=["topic", "partition"]),
            "bytes_reclaimed": CounterMetricFamily("kafka_log_cleaner_bytes_reclaimed", "Log bytes cleanings freed",
                                                   labels=["topic", "partition"]),
            "errors": CounterMetricFamily("kafka_log_cleaner_errors", "Cleanings that failed",
                                          labels=["topic", "partition"]),
        }
        for p in self.reader.partitions():
            labels = [p["topic"], str(p["partition"])]
            end.add_metric(labels, p["log_end_offset"])
            start.add_metric(labels, p["log_start_offset"])
            high.add_metric(labels, p["high_watermark"])
            stable.add_metric(labels, p["high_watermark"] - p["last_stable_offset"])
            for name, value in p.get("cleaning", {}).items():
                cleaning[name].add_metric(labels, value)
        yield from (end, start, high, stable, *cleaning.values())
        committed = GaugeMetricFamily("kafka_consumergroup_current_offset", "Committed offset of a group",
                                      labels=["consumergroup", "topic", "partition"])
        lag = GaugeMetricFamily("kafka_consumergroup_lag", "High watermark minus the committed offset",
                                labels=["consumergroup", "topic", "partition"])
        groups, _ = self.reader.group_lag()
        for group, partitions in groups.items():
            for p in partitions:
                labels = [group, p["topic"], str(p["partition"])]
                committed.add_metric(labels, p["committed_offset"])
                if p["lag"] is not None:
                    lag.add_metric(labels, p["lag"])
        yield from (committed, lag)
        transactions, _ = self.reader.transactions()
        durations = [t["duration_ms"] or 0 for t in transactions if t["state"] in OPEN_STATES]
        yield GaugeMetricFamily("shmbroker_transactions_oldest_open_ms",
                                "How long the longest open transaction has been open (0: none is)",
                                value=max(durations, default=0))


class MetricsEndpoint:
    """The endpoint of the node a supervisor runs (node.supervisor.Endpoint): `start` once the node's shared
    memory exists (OSError if it cannot listen), `stop` at the end; served from a daemon thread."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: NodeReader | None = None
        self._server = None  # (server, thread)

    def start(self, data_dir: str) -> None:
        self._reader = NodeReader(locate(data_dir))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(StatsCollector(self._reader))
        try:
            self._server = start_http_server(self.port, addr=self.host, registry=registry)
        except OSError:
            self.stop()
            raise

    def stop(self) -> None:
        if self._server is not None:
            server, thread = self._server
            server.shutdown()
            server.server_close()
            thread.join(1.0)
            self._server = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
