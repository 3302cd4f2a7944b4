"""`shmbroker dashboard`: a live terminal view of a running node (rich), and the tables of `stats`, `topics`, `groups`,
`transactions`.

Each refresh (default every second) reads the stats segment (node.tools.inspect: shared memory, no request to the
node) and asks psutil about the node's processes (the supervisor and its children): CPU %, RSS, context
switches per second, open files, TCP connections. Rates are differences of the counters between two refreshes;
sparklines keep the last minute. Group lag comes from the segment too (committed offsets written by the timer,
high watermarks from the partition table), and so do the LSO lag per partition and the longest open
transactions (the transaction coordinator's state, published by the timer): the dashboard never sends the node a
request.

Invariants: the dashboard never writes to the node; a node that is gone shows one clear line and is looked for
again every refresh (a restarted node is picked up by its data directory); every loop is bounded by --duration
when given, and by Ctrl-C otherwise.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field

import psutil
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from shmbroker.node.tools.inspect import OPEN_STATES, NodeNotRunning, NodeReader, api_name, locate
from shmbroker.shm import stats as S

SPARK = "▁▂▃▄▅▆▇█"
HISTORY = 60  # refreshes kept for sparklines (a minute at the default interval)
LAG_INTERVAL_S = 1.0
MAX_LAG_GROUPS = 20  # rows of group lag (and of LSO lag) in the view
MAX_OPEN_TRANSACTIONS = 5  # rows of the longest open transactions in the view
# psutil's connection list parses /proc/net/tcp (every socket of the host): refreshed this often, not every second.
CONNECTIONS_INTERVAL_S = 5.0
MB = 1024 * 1024


def sparkline(values: collections.deque | list) -> str:
    values = list(values)
    if not values:
        return ""
    top = max(values)
    if top <= 0:
        return SPARK[0] * len(values)
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)


def _mb(value: float) -> str:
    return f"{value / MB:.1f}"


@dataclass
class ProcessView:
    process: psutil.Process
    last_switches: int = 0
    last_at: float = 0.0
    connections: int = 0
    connections_at: float = 0.0


@dataclass
class DashboardState:
    data_dir: str
    reader: NodeReader | None = None
    supervisor_pid: int = 0
    previous: dict[int, tuple[float, S.RowSnapshot]] = field(default_factory=dict)  # row -> (when, snapshot)
    processes: dict[int, ProcessView] = field(default_factory=dict)
    history: dict[str, collections.deque] = field(default_factory=lambda: collections.defaultdict(
        lambda: collections.deque(maxlen=HISTORY)))
    gone_since: float | None = None
    last_error: str = ""
    lag: dict[str, int] = field(default_factory=dict)
    cleaning: dict[str, dict] = field(default_factory=dict)  # the dirtiest compacted logs' cleaning figures
    lso_lag: dict[str, int] = field(default_factory=dict)  # the partitions furthest behind in open transactions
    oldest_open: list[dict] = field(default_factory=list)  # the longest open transactions
    lag_at: float = 0.0


class Dashboard:
    def __init__(self, data_dir: str) -> None:
        self.state = DashboardState(data_dir)

    # -- finding the node ------------------------------------------------------------------

    def _connect(self) -> bool:
        state = self.state
        try:
            location = locate(state.data_dir)
        except NodeNotRunning as exc:
            self._drop(str(exc))
            return False
        if state.reader is not None and location.supervisor_pid == state.supervisor_pid:
            return True
        self._drop("")
        try:
            state.reader = NodeReader(location)
        except NodeNotRunning as exc:
            self._drop(str(exc))
            return False
        state.supervisor_pid = location.supervisor_pid
        state.gone_since = None
        return True

    def _drop(self, reason: str) -> None:
        state = self.state
        if state.reader is not None:
            state.reader.close()
            state.reader = None
            state.previous.clear()
            state.processes.clear()
        if reason:
            state.last_error = reason
            if state.gone_since is None:
                state.gone_since = time.monotonic()

    # -- one refresh ------------------------------------------------------------------------

    def _process_rows(self, now: float, rows: list[S.RowSnapshot]) -> Table:
        state = self.state
        table = Table(title="processes", expand=True)
        for column in ("process", "pid", "CPU %", "RSS MB", "ctx sw/s", "files", "conns", "loop/s"):
            table.add_column(column, justify="right" if column not in ("process",) else "left")
        for row in rows:
            view = state.processes.get(row.pid)
            try:
                if view is None:
                    view = state.processes[row.pid] = ProcessView(psutil.Process(row.pid))
                    view.process.cpu_percent(None)
                p = view.process
                with p.oneshot():
                    cpu = p.cpu_percent(None)
                    rss = p.memory_info().rss
                    switches = sum(p.num_ctx_switches())
                    files = p.num_fds()
                if row.role == "worker" and now - view.connections_at >= CONNECTIONS_INTERVAL_S:
                    view.connections_at = now
                    view.connections = sum(1 for c in p.net_connections(kind="tcp")
                                           if c.status == psutil.CONN_ESTABLISHED)
                conns = view.connections
            except psutil.Error:
                state.processes.pop(row.pid, None)
                continue
            rate = (switches - view.last_switches) / (now - view.last_at) if view.last_at else 0.0
            view.last_switches, view.last_at = switches, now
            turns = self._rate(row, "loop_turns", now)
            table.add_row(row.label, str(row.pid), f"{cpu:.0f}", _mb(rss), f"{rate:.0f}", str(files), str(conns),
                          f"{turns:.0f}")
            state.history[f"cpu {row.label}"].append(cpu)
        return table

    def _rate(self, row: S.RowSnapshot, name: str, now: float, position: int | None = None) -> float:
        before = self.state.previous.get(row.row)
        if before is None:
            return 0.0
        when, old = before
        elapsed = max(1e-3, now - when)
        if position is None:
            return max(0, row.get(name) - old.get(name)) / elapsed
        return max(0, int(row.array(name)[position]) - int(old.array(name)[position])) / elapsed

    def _api_table(self, now: float, rows: list[S.RowSnapshot]) -> Table:
        rates: dict[int, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
        for row in rows:
            if row.role != "worker" or row.row not in self.state.previous:
                continue
            for key in range(S.MAX_APIS):
                if row.array("requests")[key]:
                    r = rates[key]
                    r[0] += self._rate(row, "requests", now, key)
                    # errors: responses carrying an error code, and requests that cost their connection
                    r[1] += self._rate(row, "error_responses", now, key) + self._rate(row, "request_errors", now, key)
                    r[2] += self._rate(row, "bytes_in", now, key)
                    r[3] += self._rate(row, "bytes_out", now, key)
        table = Table(title="requests", expand=True)
        for column in ("API", "req/s", "err/s", "MB/s in", "MB/s out", "last minute"):
            table.add_column(column, justify="left" if column in ("API", "last minute") else "right")
        total_in = total_out = 0.0
        for key in sorted(rates):
            r = rates[key]
            total_in += r[2]
            total_out += r[3]
            history = self.state.history[f"api {key}"]
            history.append(r[0])
            table.add_row(api_name(key), f"{r[0]:.0f}", f"{r[1]:.0f}", _mb(r[2]), _mb(r[3]), sparkline(history))
        self.state.history["MB/s in"].append(total_in / MB)
        self.state.history["MB/s out"].append(total_out / MB)
        table.add_row("all", "", "", _mb(total_in), _mb(total_out),
                      f"in {sparkline(self.state.history['MB/s in'])}")
        return table

    def _timer_table(self, now: float, rows: list[S.RowSnapshot]) -> Table:
        table = Table(title="timer, rings, groups", expand=True)
        table.add_column("what")
        table.add_column("now", justify="right")
        table.add_column("last minute")
        timer = next((row for row in rows if row.role == "timer"), None)
        workers = [row for row in rows if row.role == "worker"]
        if timer is not None:
            for kind in S.PURGATORIES:
                pending = timer.get(f"purgatory_{kind}_pending")
                history = self.state.history[f"purgatory {kind}"]
                history.append(pending)
                table.add_row(f"purgatory {kind}: pending (done/s, expired/s)",
                              f"{pending} ({self._rate(timer, f'purgatory_{kind}_completed', now):.0f}, "
                              f"{self._rate(timer, f'purgatory_{kind}_expired', now):.0f})", sparkline(history))
            by_level = timer.array("wheel_entries_by_level")[:max(1, timer.get("wheel_levels"))].tolist()
            table.add_row("wheel entries / levels", f"{timer.get('wheel_entries')} / {timer.get('wheel_levels')}",
                          "by level " + " ".join(str(n) for n in by_level))
            late = timer.get("timer_lateness_p99_us")
            self.state.history["lateness"].append(late)
            table.add_row("timer lateness p50 / p99 (ms)",
                          f"{timer.get('timer_lateness_p50_us') / 1000:.1f} / {late / 1000:.1f}",
                          sparkline(self.state.history["lateness"]))
            fsyncs = self._rate(timer, "fsyncs", now)
            fsync_us = self._rate(timer, "fsync_us_total", now)
            table.add_row("fsyncs/s, avg ms, MB/s flushed",
                          f"{fsyncs:.0f}, {fsync_us / fsyncs / 1000 if fsyncs else 0:.2f}, "
                          f"{_mb(self._rate(timer, 'bytes_flushed', now))}", "")
            table.add_row("throttled clients (throttle ms/s)",
                          f"{timer.get('throttled_clients')} ({self._rate(timer, 'throttle_ms_total', now):.0f})", "")
            table.add_row("groups / members / rebalances",
                          f"{timer.get('groups')} / {timer.get('group_members')} / {timer.get('rebalances')}", "")
            table.add_row("transactions open / committed / aborted (timed out)",
                          f"{timer.get('transactions_open')} / {timer.get('transactions_committed')} / "
                          f"{timer.get('transactions_aborted')} ({timer.get('transactions_timed_out')})", "")
        for row in workers:
            capacity = int(row.array("ring_capacity_bytes")[0]) or 1
            used = int(row.array("ring_used_bytes")[0])
            down = int(timer.array("ring_used_bytes")[row.index]) if timer is not None else 0
            table.add_row(f"rings of worker {row.index}: request / completion used %",
                          f"{100 * used / capacity:.1f} / {100 * down / capacity:.1f}",
                          f"{row.get('connections')} conns, {row.get('delayed_waiting')} waiting")
        for row in rows:
            if row.role == "cleaner":
                table.add_row(f"cleaner {row.index}: busy, MB/s read, cleanings (errors)",
                              f"{row.get('cleaner_busy')}, {_mb(self._rate(row, 'cleaner_bytes_read', now))}, "
                              f"{row.get('cleanings')} ({row.get('cleaner_errors')})",
                              f"reclaimed {_mb(row.get('cleaner_bytes_reclaimed'))} MB")
        for name, cleaning in self.state.cleaning.items():
            table.add_row(f"log {name}: dirty %, compaction delay s",
                          f"{100 * cleaning['dirty_ratio']:.0f}, {cleaning['lag_ms'] / 1000:.0f}",
                          f"{cleaning['errors']} errors" if cleaning["errors"] else "")
        for group, lag in sorted(self.state.lag.items()):
            table.add_row(f"group {group}: lag", str(lag), "")
        for name, lag in self.state.lso_lag.items():
            table.add_row(f"partition {name}: LSO lag (records in open transactions)", str(lag), "")
        for t in self.state.oldest_open:
            table.add_row(f"transaction {t['transactional_id']}: {t['state']}, open for (s)",
                          f"{(t['duration_ms'] or 0) / 1000:.1f}",
                          f"{len(t['partitions'])} partitions, timeout {t['timeout_ms'] / 1000:.0f} s")
        return table

    def _refresh_lag(self, now: float, rows: list[S.RowSnapshot]) -> None:
        """Total lag per group (at most MAX_LAG_GROUPS, the largest first), every LAG_INTERVAL_S."""
        state = self.state
        if now - state.lag_at < LAG_INTERVAL_S or state.reader is None:
            return
        state.lag_at = now
        partitions = state.reader.partitions()
        cleaning = {f"{p['topic']}-{p['partition']}": p["cleaning"] for p in partitions if "cleaning" in p}
        state.cleaning = dict(sorted(cleaning.items(), key=lambda item: -item[1]["dirty_ratio"])[:MAX_LAG_GROUPS])
        lso_lag = {f"{p['topic']}-{p['partition']}": p["high_watermark"] - p["last_stable_offset"]
                   for p in partitions}
        state.lso_lag = dict(sorted(((name, lag) for name, lag in lso_lag.items() if lag > 0),
                                    key=lambda item: -item[1])[:MAX_LAG_GROUPS])
        transactions, _ = state.reader.transactions()
        open_ones = [t for t in transactions if t["state"] in OPEN_STATES]
        state.oldest_open = sorted(open_ones, key=lambda t: -(t["duration_ms"] or 0))[:MAX_OPEN_TRANSACTIONS]
        groups, complete = state.reader.group_lag()
        totals = {group: sum(p["lag"] or 0 for p in partitions) for group, partitions in groups.items()}
        largest = sorted(totals.items(), key=lambda item: -item[1])[:MAX_LAG_GROUPS]
        state.lag = dict(largest)
        if not complete or len(totals) > MAX_LAG_GROUPS:
            state.lag["(more groups: shmbroker groups list)"] = 0

    def render(self) -> Group:
        state = self.state
        now = time.monotonic()
        if not self._connect():
            gone = now - (state.gone_since or now)
            return Group(Text(f"node not running ({gone:.0f} s): {state.last_error}; looking again every refresh",
                              style="bold red"))
        try:
            rows = state.reader.rows()
        except (S.TornReadError, ValueError) as exc:
            self._drop(f"cannot read the stats segment: {exc}")
            return Group(Text(state.last_error, style="bold red"))
        location = state.reader.location
        header = Text(f"shmbroker {location.host}:{location.port}  data {location.data_dir}  "
                      f"supervisor pid {location.supervisor_pid}  {time.strftime('%H:%M:%S')}", style="bold")
        processes = self._process_rows(now, rows)
        apis = self._api_table(now, rows)
        timer = self._timer_table(now, rows)
        self._refresh_lag(now, rows)
        state.previous = {row.row: (now, row) for row in rows}
        return Group(header, processes, apis, timer)


def run_dashboard(data_dir: str, interval: float, duration: float = 0.0) -> int:
    dashboard = Dashboard(data_dir)
    console = Console()
    deadline = time.monotonic() + duration if duration > 0 else None
    # Drawn once per refresh, not by rich's own refresh thread (which would redraw the same view 4 times a second).
    with Live(dashboard.render(), console=console, auto_refresh=False, screen=False, transient=False) as live:
        while deadline is None or time.monotonic() < deadline:
            time.sleep(interval)
            live.update(dashboard.render(), refresh=True)
    dashboard._drop("")
    return 0


# -- one-shot tables -------------------------------------------------------------------------

def render_stats(document: dict) -> None:
    console = Console()
    node = document["node"]
    console.print(f"[bold]shmbroker {node['listen']}[/] data {node['data_dir']} supervisor pid {node['supervisor_pid']}")
    processes = Table(title="processes")
    for column in ("process", "pid", "loop turns", "connections", "waiting", "published"):
        processes.add_column(column)
    for p in document["processes"]:
        label = f"worker {p['index']}" if p["role"] == "worker" else p["role"]
        processes.add_row(label, str(p["pid"]), str(p.get("loop_turns", 0)), str(p.get("connections", 0)),
                          str(p.get("delayed_waiting", 0)), time.strftime("%H:%M:%S", time.localtime(
                              p.get("published_ms", 0) / 1000)))
    console.print(processes)
    apis = Table(title="requests per API (since start)")
    for column in ("API", "requests", "error responses", "connections closed", "denied", "bytes in", "bytes out"):
        apis.add_column(column, justify="right")
    for name, counts in sorted(document["apis"].items()):
        apis.add_row(name, str(counts["requests"]), str(counts["error_responses"]), str(counts["request_errors"]),
                     str(counts.get("authorization_denials", 0)), str(counts["bytes_in"]), str(counts["bytes_out"]))
    console.print(apis)
    if document["errors"]:
        errors = Table(title="error codes in responses (since start)")
        errors.add_column("error")
        errors.add_column("count", justify="right")
        for name, count in sorted(document["errors"].items(), key=lambda item: -item[1]):
            errors.add_row(name, str(count))
        console.print(errors)
    totals = Table(title="node totals")
    totals.add_column("counter")
    totals.add_column("value", justify="right")
    for name, value in document["totals"].items():
        if value:
            totals.add_row(name, str(value))
    console.print(totals)
    rings = Table(title="rings")
    for column in ("worker", "request frames", "request used", "completion frames", "completion used"):
        rings.add_column(column, justify="right")
    for ring in document["rings"]:
        done = ring.get("completion", {})
        rings.add_row(str(ring["worker"]), str(ring["request"]["frames_sent"]), str(ring["request"]["used_bytes"]),
                      str(done.get("frames_sent", "")), str(done.get("used_bytes", "")))
    console.print(rings)
    partitions = Table(title="partitions")
    for column in ("topic", "partition", "log start", "log end", "high watermark", "LSO lag", "unflushed bytes",
                   "dirty", "cleaned (reclaimed) MB"):
        partitions.add_column(column, justify="right")
    for p in document["partitions"]:
        cleaning = p.get("cleaning")
        partitions.add_row(p["topic"], str(p["partition"]), str(p["log_start_offset"]), str(p["log_end_offset"]),
                           str(p["high_watermark"]), str(p["high_watermark"] - p["last_stable_offset"]),
                           str(p["unflushed_bytes"]),
                           f"{100 * cleaning['dirty_ratio']:.0f}%" if cleaning else "",
                           f"{_mb(cleaning['bytes_cleaned'])} ({_mb(cleaning['bytes_reclaimed'])})" if cleaning else "")
    console.print(partitions)
    if document["groups"]:
        lag = Table(title="committed offsets and lag" + ("" if document["groups_complete"] else
                                                          " (more groups than the segment holds)"))
        for column in ("group", "topic", "partition", "committed", "high watermark", "lag"):
            lag.add_column(column, justify="right")
        for group, entry in document["groups"].items():
            for p in entry["partitions"]:
                lag.add_row(group, p["topic"], str(p["partition"]), str(p["committed_offset"]),
                            str(p["high_watermark"]), "-" if p["lag"] is None else str(p["lag"]))
        console.print(lag)
    if document["open_transactions"]:
        open_table = Table(title="open transactions" + ("" if document["transactions_complete"] else
                                                        " (more transactional ids than the segment holds)"))
        for column in ("transactional id", "state", "producer id", "epoch", "partitions", "open for (s)",
                       "timeout (s)"):
            open_table.add_column(column, justify="right")
        for t in document["open_transactions"]:
            open_table.add_row(t["transactional_id"], t["state"], str(t["producer_id"]), str(t["producer_epoch"]),
                               str(len(t["partitions"])), f"{(t['duration_ms'] or 0) / 1000:.1f}",
                               f"{t['timeout_ms'] / 1000:.0f}")
        console.print(open_table)


def render_topics(topics: list[dict]) -> None:
    table = Table()
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    for topic in topics:
        table.add_row(topic["topic"], str(topic["partitions"]))
    Console().print(table)


def render_topic(topic: dict) -> None:
    title = topic["topic"] if topic.get("topic_id") is None else f"{topic['topic']} (topic id {topic['topic_id']})"
    table = Table(title=title)
    for column in ("partition", "leader", "log start", "high watermark"):
        table.add_column(column, justify="right")
    for p in topic["partitions"]:
        table.add_row(str(p["partition"]), str(p["leader"]), str(p["log_start_offset"]), str(p["high_watermark"]))
    Console().print(table)


def _wall(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) if ms >= 0 else "-"


def render_transactions(transactions: list[dict]) -> None:
    table = Table()
    for column in ("transactional id", "state", "producer id", "epoch", "partitions", "open for (s)"):
        table.add_column(column, justify="left" if column in ("transactional id", "state") else "right")
    for t in transactions:
        table.add_row(t["transactional_id"], t["state"], str(t["producer_id"]), str(t["producer_epoch"]),
                      str(len(t["partitions"])), "-" if t["duration_ms"] is None else f"{t['duration_ms'] / 1000:.1f}")
    Console().print(table)


def render_transaction(t: dict) -> None:
    console = Console()
    console.print(f"[bold]transactional id {t['transactional_id']}[/] state {t['state']}")
    changed = "" if t["last_update_ms"] is None else f"  last change {_wall(t['last_update_ms'])}"  # not in the Kafka API
    console.print(f"producer id {t['producer_id']} epoch {t['producer_epoch']}  timeout {t['timeout_ms']} ms{changed}")
    if t["start_ms"] >= 0:
        console.print(f"transaction started {_wall(t['start_ms'])} ({t['duration_ms'] / 1000:.1f} s ago)")
    if t["groups"]:
        console.print("consumer groups: " + ", ".join(t["groups"]))
    table = Table(title="partitions of the transaction")
    table.add_column("topic")
    table.add_column("partition", justify="right")
    for p in t["partitions"]:
        table.add_row(p["topic"], str(p["partition"]))
    console.print(table)


def render_groups(groups: list[dict]) -> None:
    table = Table()
    table.add_column("group")
    table.add_column("state")
    for group in groups:
        table.add_row(group["group"], group["state"])
    Console().print(table)


def render_acls(acls: list[dict], verb: str = "") -> None:
    table = Table(title=f"{len(acls)} ACL(s) {verb}".strip())
    for column in ("resource", "name", "pattern", "principal", "host", "operation", "permission"):
        table.add_column(column)
    for acl in acls:
        table.add_row(acl["resource_type"], acl["resource_name"], acl["pattern_type"], acl["principal"], acl["host"],
                      acl["operation"], acl["permission"])
    Console().print(table)


def render_group(group: dict) -> None:
    console = Console()
    epochs = f" group epoch {group['group_epoch']} (assignment {group['assignment_epoch']})" \
        if "group_epoch" in group else ""
    console.print(f"[bold]group {group['group']}[/] type {group.get('type', 'classic')} state {group['state']} "
                  f"protocol {group['protocol']}{epochs} members {len(group['members'])} total lag {group['total_lag']}")
    if group["members"]:
        members = Table()
        for column in ("member", "epoch", "instance", "client", "assigned", "target"):
            members.add_column(column)
        for m in group["members"]:
            target, epoch = m.get("target"), m.get("member_epoch")
            members.add_row(m["member_id"], "" if epoch is None else str(epoch), m.get("instance_id") or "",
                            m["client_id"], " ".join(m["partitions"]), "" if target is None else " ".join(target))
        console.print(members)
    table = Table()
    if group.get("type") == "share":  # KIP-932: each share-partition's start offset, no owner
        for column in ("topic", "partition", "start offset", "high watermark", "lag", "in flight"):
            table.add_column(column, justify="right")
        for p in group["partitions"]:
            table.add_row(p["topic"], str(p["partition"]), "-" if p["start_offset"] is None else str(p["start_offset"]),
                          str(p["high_watermark"]), "-" if p["lag"] is None else str(p["lag"]),
                          "-" if p.get("in_flight") is None else str(p["in_flight"]))
        console.print(table)
        return
    for column in ("topic", "partition", "committed", "high watermark", "lag", "member"):
        table.add_column(column, justify="right")
    for p in group["partitions"]:
        table.add_row(p["topic"], str(p["partition"]), "-" if p["committed_offset"] is None else str(p["committed_offset"]),
                      str(p["high_watermark"]), "-" if p["lag"] is None else str(p["lag"]), p["member_id"] or "")
    console.print(table)
