"""The `shmbroker` command line.

    shmbroker serve [--config FILE] [--listen HOST:PORT] [--data-dir DIR] [--workers N] [--metrics HOST:PORT]
    shmbroker stats [--data-dir DIR] [--json]           one snapshot of the stats segment (no request to the node)
    shmbroker dashboard [--data-dir DIR]                live view: processes (psutil) and the node's rates
    shmbroker topics list|create|describe|delete [--bootstrap HOST:PORT] ...
    shmbroker groups list|describe [--bootstrap HOST:PORT] ...      (lag per partition; share groups too)
    shmbroker transactions list|describe ID [--data-dir DIR | --bootstrap HOST:PORT] [--json]
                                            (the coordinator's state: from shared memory, or the Kafka API)
    shmbroker users add NAME --mechanism SCRAM-SHA-256|SCRAM-SHA-512|PLAIN --password-stdin [--data-dir DIR]
    shmbroker users list|delete [NAME] [--data-dir DIR]    (the SASL users store; a running node takes changes)
    shmbroker --version

Exit codes: 0 done; 1 the operation failed (the broker's error, a child that cannot boot); 2 bad usage or a bad
config file (file:line: key: reason); 3 no node running / no broker reachable; 4 the port or the data directory
is taken by someone else.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import metadata

if __name__ == "__main__" and "hypothesis" not in sys.modules:
    # kio imports hypothesis wherever it is installed (a test dependency), to register test strategies for its
    # types: a quarter of a second of CPU in every start of a node, which never uses them. Run as a program, the
    # CLI imports kio as where hypothesis is not installed.
    sys.modules["hypothesis"] = None

import orjson

from shmbroker.node import config as node_config

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_NOT_RUNNING = 3
EXIT_IN_USE = 4
EXIT_NEWER_FORMAT = 5  # the data directory was written by a newer node: nothing was changed
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_TIMEOUT_S = 10.0  # each Kafka API answer of `topics` and `groups`
DEFAULT_CONNECT_TIMEOUT_S = 3.0  # their first TCP connect: an address nobody answers is reported this soon


def _version() -> str:
    try:
        return metadata.version("shmbroker")
    except metadata.PackageNotFoundError:
        return "unknown"


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless it has none to show (None: the help says it in words;
    a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    formatter = _Help
    parser = argparse.ArgumentParser(prog="shmbroker", description="Kafka-compatible single-node broker",
                                     formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"shmbroker {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(parent, name: str, help: str) -> argparse.ArgumentParser:
        return parent.add_parser(name, help=help, description=help, formatter_class=formatter)

    serve = command(sub, "serve", "run the node")
    serve.add_argument("--config", help="TOML config file (every key optional; default: none, every setting "
                                        "at its default, as node/config.py gives them)")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default: the config's server.host and "
                                        "server.port, 127.0.0.1:9092 unless it says otherwise)")
    serve.add_argument("--data-dir", help="data directory (default: the config's server.data_dir, ./data unless "
                                          "it says otherwise)")
    serve.add_argument("--workers", type=int, help="network worker processes (default: the config's "
                                                   "server.workers, one per CPU unless it says otherwise)")
    serve.add_argument("--metrics", metavar="HOST:PORT",
                       help="serve Prometheus metrics at http://HOST:PORT/metrics (default: off; HOST is "
                            "127.0.0.1 when only :PORT is given)")

    stats = command(sub, "stats", "one snapshot of the node's counters, read from shared memory")
    stats.add_argument("--data-dir", default="./data", help="the node's data directory")
    stats.add_argument("--json", action="store_true", help="one JSON document")

    dash = command(sub, "dashboard", "live terminal view of the node's processes and rates")
    dash.add_argument("--data-dir", default="./data", help="the node's data directory")
    dash.add_argument("--interval", type=float, default=1.0, help="refresh interval in seconds")
    dash.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: until Ctrl-C)")

    def kafka_api(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap", default=DEFAULT_BOOTSTRAP, help="HOST:PORT of any broker")
        p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                       help="seconds to wait for a TCP connection to the broker")
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds to wait for each answer")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        p.add_argument("--command-config", metavar="FILE",
                       help="client settings, key=value per line (librdkafka's names: security.protocol, "
                            "sasl.mechanism, sasl.username, sasl.password, ssl.ca.location, ...), as Kafka's tools "
                            "(default: none, a PLAINTEXT listener)")

    topics = command(sub, "topics", "list, create, describe, delete topics (Kafka API)")
    topics_sub = topics.add_subparsers(dest="action", required=True)
    for action, text in (("list", "every topic and its partition count"),
                         ("create", "create a topic"),
                         ("describe", "a topic's partitions with their offsets"),
                         ("delete", "delete a topic")):
        p = command(topics_sub, action, text)
        kafka_api(p)
        if action != "list":
            p.add_argument("topic", help="the topic's name")
        else:
            p.add_argument("--internal", action="store_true", help="include internal topics (__consumer_offsets)")
        if action == "create":
            p.add_argument("--partitions", type=int, default=1, help="number of partitions")

    groups = command(sub, "groups", "list consumer and share groups, describe one with its lag (Kafka API)")
    groups_sub = groups.add_subparsers(dest="action", required=True)
    for action, text in (("list", "every consumer group and share group (KIP-932) and its state"),
                         ("describe", "a group's members, committed offsets and lag per partition (a share group's: "
                                      "each share-partition's start offset, lag and records in flight)")):
        p = command(groups_sub, action, text)
        kafka_api(p)
        if action == "describe":
            p.add_argument("group", help="the group id")

    transactions = command(sub, "transactions", "list transactional ids, describe one (the transaction coordinator's "
                                                "state, read from shared memory; with --bootstrap, the Kafka API)")
    transactions_sub = transactions.add_subparsers(dest="action", required=True)
    for action, text in (("list", "every transactional id: its state, producer id and epoch"),
                         ("describe", "a transactional id's state, producer, timeout and open transaction")):
        p = command(transactions_sub, action, text)
        p.add_argument("--data-dir", default="./data", help="the node's data directory")
        p.add_argument("--bootstrap", help="HOST:PORT of any broker: ask it (ListTransactions, DescribeTransactions) "
                                           "instead of reading the local node's shared memory")
        p.add_argument("--connect-timeout", type=float, default=DEFAULT_CONNECT_TIMEOUT_S,
                       help="with --bootstrap: seconds to wait for a TCP connection")
        p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                       help="with --bootstrap: seconds to wait for each answer")
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if action == "describe":
            p.add_argument("transactional_id", help="the transactional.id")
    acls = command(sub, "acls", "add, list, remove ACLs (Kafka API: CreateAcls, DescribeAcls, DeleteAcls)")
    acls_sub = acls.add_subparsers(dest="action", required=True)
    for action, text in (("add", "allow or deny principals operations on a resource"),
                         ("list", "the ACLs matching the options (all without any; nothing for a principal without "
                                  "DESCRIBE on the cluster: librdkafka does not pass DescribeAcls' error on)"),
                         ("remove", "remove the ACLs matching the options")):
        p = command(acls_sub, action, text)
        kafka_api(p)
        resource = p.add_mutually_exclusive_group(required=action == "add")
        resource.add_argument("--topic", help="a topic (or a prefix with --resource-pattern-type prefixed; '*': all)")
        resource.add_argument("--group", help="a consumer group (or a prefix, or '*')")
        resource.add_argument("--transactional-id", help="a transactional.id (or a prefix, or '*')")
        resource.add_argument("--cluster", action="store_true", help="the cluster")
        patterns = ("literal", "prefixed") if action == "add" else ("literal", "prefixed", "match", "any")
        p.add_argument("--resource-pattern-type", choices=patterns, default="literal" if action == "add" else "any",
                       help="how the resource name matches (match: the ACLs that apply to the named resource)")
        p.add_argument("--operation", action="append", type=str.upper, default=[],
                       help="READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS, "
                            "ALTER_CONFIGS, IDEMPOTENT_WRITE or ALL; repeat for several"
                            + (" (at least one)" if action == "add" else " (default: any)"))
        if action == "add":
            who = p.add_mutually_exclusive_group(required=True)
            who.add_argument("--allow-principal", help="the principal allowed (User:NAME, User:* for everyone)")
            who.add_argument("--deny-principal", help="the principal denied")
            p.add_argument("--host", default="*", help="the client host the entry applies to")
        else:
            p.add_argument("--principal", help="only ACLs of this principal")
            p.add_argument("--host", help="only ACLs of this host")
            p.add_argument("--permission", type=str.upper, choices=("ALLOW", "DENY", "ANY"), default="ANY")
    users = command(sub, "users", "add, list, delete the SASL users (the data directory's users store; a running "
                                  "node picks changes up)")
    users_sub = users.add_subparsers(dest="action", required=True)
    for action, text in (("add", "add a user, or set its password for a mechanism"),
                         ("list", "every user and its mechanisms"),
                         ("delete", "delete a user and all its credentials")):
        p = command(users_sub, action, text)
        p.add_argument("--data-dir", default="./data", help="the node's data directory")
        if action != "list":
            p.add_argument("name", help="the user name")
        if action == "add":
            p.add_argument("--mechanism", required=True, choices=("SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"))
            p.add_argument("--password-stdin", action="store_true", required=True,
                           help="read the password from the first line of standard input")
            p.add_argument("--iterations", type=int, default=4096, help="SCRAM iterations (at least 4096)")
        if action == "list":
            p.add_argument("--json", action="store_true", help="one JSON document")
    return parser


def _error(message: str, code: int) -> int:
    print(f"shmbroker: {message}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"serve": _serve, "stats": _stats, "dashboard": _dashboard, "topics": _topics, "groups": _groups,
               "transactions": _transactions, "users": _users, "acls": _acls}
    try:
        return handler[args.command](args)
    except KeyboardInterrupt:
        return 130


def _users(args: argparse.Namespace) -> int:
    from shmbroker.node.storage.users import UsersError, UsersStore

    store = UsersStore(args.data_dir)
    try:
        if args.action == "add":
            password = sys.stdin.readline().rstrip("\r\n")
            store.add(args.name, args.mechanism, password, args.iterations)
            print(f"user {args.name}: {args.mechanism} set")
        elif args.action == "delete":
            if not store.delete(args.name):
                return _error(f"no user {args.name}", EXIT_FAILED)
            print(f"user {args.name} deleted")
        else:
            listed = store.list()
            if args.json:
                print(orjson.dumps({name: [{"mechanism": m, "iterations": i} for m, i in items]
                                    for name, items in listed.items()}).decode())
            else:
                for name, items in listed.items():
                    print(f"{name}\t" + ", ".join(f"{m} ({i} iterations)" for m, i in items))
    except UsersError as exc:
        return _error(str(exc), EXIT_USAGE)
    except (OSError, ValueError) as exc:
        return _error(f"users store in {args.data_dir}: {exc}", EXIT_FAILED)
    return 0


def _serve(args: argparse.Namespace) -> int:
    overrides: dict[str, object] = {}
    metrics = None
    try:
        if args.listen:
            host, port = node_config.parse_listen(args.listen)
            overrides["server.host"] = host
            overrides["server.port"] = port
        if args.data_dir:
            overrides["server.data_dir"] = args.data_dir
        if args.workers is not None:
            if args.workers < 1:
                raise node_config.ConfigError("--workers must be at least 1")
            overrides["server.workers"] = args.workers
        if args.metrics:
            text = args.metrics if not args.metrics.startswith(":") else "127.0.0.1" + args.metrics
            from shmbroker.node.tools.metrics import MetricsEndpoint

            metrics = MetricsEndpoint(*node_config.parse_listen(text))
        if os.environ.get(node_config.WATCH_ANSWERS_ENV) == "1":
            overrides["checks.watch_answers"] = True
        cfg = node_config.load(args.config, overrides)
    except node_config.ConfigError as exc:
        return _error(str(exc), EXIT_USAGE)

    from shmbroker.node.logging_setup import setup_logging
    from shmbroker.node.proctitle import set_title
    from shmbroker.node.supervisor import serve as run_node

    setup_logging("supervisor")
    set_title(f"supervisor {cfg.server.host}:{cfg.server.port} {cfg.server.data_dir}")
    reload = (lambda: node_config.load(args.config, overrides)) if args.config else None
    code = run_node(cfg, reload, metrics)
    # The node is stopped: its files are closed and its shared memory unlinked. What is left is the interpreter's
    # teardown of every module the supervisor imported for its children (node.supervisor forks them), a fifth of
    # a second that nobody waits for.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _stats(args: argparse.Namespace) -> int:
    from shmbroker.node.tools.inspect import NodeNotRunning, NodeReader, snapshot_document

    try:
        reader = NodeReader.open(args.data_dir)
    except NodeNotRunning as exc:
        return _error(str(exc), EXIT_NOT_RUNNING)
    try:
        document = snapshot_document(reader)
    finally:
        reader.close()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        from shmbroker.node.tools.dashboard import render_stats
        render_stats(document)
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    from shmbroker.node.tools.dashboard import run_dashboard

    return run_dashboard(args.data_dir, args.interval, args.duration)


def _print(document: object, as_json: bool, render) -> None:
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        render(document)


def _admin_call(args: argparse.Namespace, call) -> int:
    from shmbroker.node.tools.admin import Admin, AdminError, Unreachable, read_client_properties

    try:
        node_config.parse_listen(args.bootstrap)
    except node_config.ConfigError as exc:
        return _error(f"--bootstrap: {exc}", EXIT_USAGE)
    try:
        settings = read_client_properties(args.command_config) if args.command_config else None
    except (OSError, ValueError) as exc:
        return _error(f"--command-config: {exc}", EXIT_USAGE)
    try:
        return call(Admin(args.bootstrap, args.timeout, args.connect_timeout, settings))
    except Unreachable as exc:
        return _error(f"no broker reachable at {args.bootstrap}: {exc}", EXIT_NOT_RUNNING)
    except AdminError as exc:
        return _error(str(exc), EXIT_FAILED)


def _topics(args: argparse.Namespace) -> int:
    from shmbroker.node.tools import dashboard as views

    def run(admin) -> int:
        if args.action == "list":
            _print(admin.topics(args.internal), args.json, views.render_topics)
        elif args.action == "describe":
            _print(admin.describe_topic(args.topic), args.json, views.render_topic)
        elif args.action == "create":
            if args.partitions < 1:
                return _error("--partitions must be at least 1", EXIT_USAGE)
            admin.create_topic(args.topic, args.partitions)
            _print({"created": args.topic, "partitions": args.partitions}, args.json,
                   lambda d: print(f"created topic {d['created']} with {d['partitions']} partition(s)"))
        else:
            admin.delete_topic(args.topic)
            _print({"deleted": args.topic}, args.json, lambda d: print(f"deleted topic {d['deleted']}"))
        return 0

    return _admin_call(args, run)


def _acls(args: argparse.Namespace) -> int:
    from shmbroker.node.tools import dashboard as views
    from shmbroker.node.tools.admin import AclAdmin, AclSpec

    operations = tuple(args.operation)
    known = ("READ", "WRITE", "CREATE", "DELETE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS",
             "ALTER_CONFIGS", "IDEMPOTENT_WRITE", "ALL")
    unknown = [op for op in operations if op not in known]
    if unknown:
        return _error(f"--operation: unknown {', '.join(unknown)} (one of {', '.join(known)})", EXIT_USAGE)
    if args.action == "add" and not operations:
        return _error("acls add: at least one --operation", EXIT_USAGE)
    for option, resource_type in (("topic", "TOPIC"), ("group", "GROUP"), ("transactional_id", "TRANSACTIONAL_ID")):
        if getattr(args, option) is not None:
            name = getattr(args, option)
            break
    else:
        resource_type, name = ("CLUSTER", "kafka-cluster") if args.cluster else ("ANY", None)
    if args.action == "add":
        principal = args.allow_principal or args.deny_principal
        permission = "ALLOW" if args.allow_principal else "DENY"
    else:
        principal, permission = args.principal, args.permission
    spec = AclSpec(resource_type, name, args.resource_pattern_type.upper(), principal, args.host, operations,
                   permission)

    def run(admin) -> int:
        acls = AclAdmin(admin)
        if args.action == "add":
            _print(acls.add(spec), args.json, lambda d: views.render_acls(d, "added"))
        elif args.action == "list":
            _print(acls.list(spec), args.json, views.render_acls)
        else:
            _print(acls.remove(spec), args.json, lambda d: views.render_acls(d, "removed"))
        return 0

    return _admin_call(args, run)


def _groups(args: argparse.Namespace) -> int:
    from shmbroker.node.tools import dashboard as views

    def run(admin) -> int:
        if args.action == "list":
            _print(admin.groups(), args.json, views.render_groups)
        else:
            _print(admin.describe_group(args.group), args.json, views.render_group)
        return 0

    return _admin_call(args, run)


def _transactions(args: argparse.Namespace) -> int:
    from shmbroker.node.tools import dashboard as views
    from shmbroker.node.tools.inspect import NodeNotRunning, NodeReader

    if args.bootstrap is not None:
        return _transactions_by_api(args)
    try:
        reader = NodeReader.open(args.data_dir)
    except NodeNotRunning as exc:
        return _error(str(exc), EXIT_NOT_RUNNING)
    try:
        transactions, complete = reader.transactions()
    finally:
        reader.close()
    if args.action == "list":
        if not complete:
            print("shmbroker: more transactional ids than the stats segment holds (stats.transactions_bytes): "
                  "the idle ones left out", file=sys.stderr)
        _print(transactions, args.json, views.render_transactions)
        return 0
    found = next((t for t in transactions if t["transactional_id"] == args.transactional_id), None)
    if found is None:
        more = "" if complete else " (or left out: more ids than the stats segment holds)"
        return _error(f"transactional id {args.transactional_id!r} not found{more}", EXIT_FAILED)
    _print(found, args.json, views.render_transaction)
    return 0


def _transactions_by_api(args: argparse.Namespace) -> int:
    from shmbroker.node.tools import dashboard as views
    from shmbroker.node.tools.admin import AdminError, Unreachable
    from shmbroker.node.tools.transactions_api import TransactionsApi

    try:
        node_config.parse_listen(args.bootstrap)
    except node_config.ConfigError as exc:
        return _error(f"--bootstrap: {exc}", EXIT_USAGE)
    api = TransactionsApi(args.bootstrap, args.timeout, args.connect_timeout)
    try:
        if args.action == "list":
            _print(api.list(), args.json, views.render_transactions)
            return 0
        found = api.describe(args.transactional_id)
    except Unreachable as exc:
        return _error(f"no broker reachable at {args.bootstrap}: {exc}", EXIT_NOT_RUNNING)
    except AdminError as exc:
        return _error(str(exc), EXIT_FAILED)
    if found is None:
        return _error(f"transactional id {args.transactional_id!r} not found", EXIT_FAILED)
    _print(found, args.json, views.render_transaction)
    return 0


if __name__ == "__main__":
    sys.exit(main())
