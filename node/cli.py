"""Command line: `shmbroker serve [--listen HOST:PORT] [--data-dir DIR] [--workers N] [--config FILE]`."""

from __future__ import annotations

import argparse
import sys

from node import config as node_config
from node.logging_setup import setup_logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shmbroker", description="Kafka-compatible single-node broker")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the node")
    serve.add_argument("--config", help="TOML config file")
    serve.add_argument("--listen", help="HOST:PORT to listen on (default 127.0.0.1:9092)")
    serve.add_argument("--data-dir", help="data directory (default ./data)")
    serve.add_argument("--workers", type=int, help="network worker processes (default: CPU count)")
    args = parser.parse_args(argv)

    overrides: dict[str, object] = {}
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
        cfg = node_config.load(args.config, overrides)
    except node_config.ConfigError as exc:
        print(f"shmbroker: {exc}", file=sys.stderr)
        return 2

    setup_logging("supervisor")
    from node.supervisor import serve as run_node
    reload = (lambda: node_config.load(args.config, overrides)) if args.config else None
    return run_node(cfg, reload)


if __name__ == "__main__":
    sys.exit(main())
