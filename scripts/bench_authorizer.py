"""What the authorizer costs on the produce path: raw producer records/s with `[authorizer] enabled = true` and one
ALLOW ACL per client against the authorizer off, two nodes measured alternately in one run.

Two nodes (scripts/harness/nodeproc.py, --workers workers each), alike but for the authorizer: on the first it is
on, and each load connection's principal (User:ANONYMOUS, the principal of a PLAINTEXT listener) has one ALLOW
ACL, WRITE on its topic, among --other-acls ACLs of other principals and topics (so the decision searches a real
set); on the second it is off. Rounds alternate the two (scripts/harness/abba.py: ABBA order; each ratio on/off is
the median of the rounds' own ratios). Each round runs scripts.producer_perf's raw load generator (pre-encoded
batches, --connections sockets, --inflight requests each) for --seconds against one node, then the other: records/s
and the workers' CPU per 1,000 records. Any error code in a response fails the run (a refused produce would
measure nothing).

    .venv/bin/python -m scripts.bench_authorizer [--runs 6] [--seconds 5] [--workers 2] [--json]

Only 127.0.0.1 is used; every measurement is bounded in time; the nodes are stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from node.storage.acls import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType
from scripts.harness import benchnode
from scripts.harness.abba import AlternatingRounds
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_authorizer"
METRICS = ("records_per_s", "worker_cpu_us_per_1k_records")
TOPIC = "bench-authorizer"
PRINCIPAL = "User:ANONYMOUS"


def acls(other: int) -> list[AclBinding]:
    """The load's one ALLOW, and `other` ACLs of other principals and topics (literal and prefixed)."""
    mine = [AclBinding(ResourceType.TOPIC, TOPIC, PatternType.LITERAL, PRINCIPAL, "*", Operation.WRITE,
                       Permission.ALLOW)]
    return mine + [AclBinding(ResourceType.TOPIC, f"other-{i}", PatternType.PREFIXED if i % 4 == 0 else
                              PatternType.LITERAL, f"User:client-{i}", "*", Operation.WRITE, Permission.ALLOW)
                   for i in range(other)]


def measure(node: NodeProcess, args: argparse.Namespace) -> dict:
    load = RawProduceLoad(topic=TOPIC, partitions=args.partitions,
                          pipeline=benchnode.PipelineSettings(connections=args.connections, inflight=args.inflight))
    with benchnode.CpuMeter(node) as cpu:
        outcome = run_raw_producer("127.0.0.1", node.port, load, args.seconds)
    if outcome.errors:
        raise RuntimeError(f"produce errors (code: responses) {outcome.errors}")
    records_per_s = outcome.records / outcome.elapsed_s
    return {"records_per_s": records_per_s,
            "worker_cpu_us_per_1k_records": cpu.fields["worker_cores"] * 1e9 / records_per_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench_authorizer", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=6, help="rounds: the load on each node")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--other-acls", type=int, default=1000, help="ACLs of other principals on the node")
    parser.add_argument("--control", action="store_true",
                        help="the authorizer off on both nodes (an A/A run: the bench's own bias between its nodes)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0 or args.other_acls < 0:
        parser.error("--runs and --seconds must be positive, --other-acls at least 0")
    rounds = AlternatingRounds("authorizer_on", "authorizer_off", args.runs)
    with tempfile.TemporaryDirectory(prefix="bench-authorizer-") as work_dir:
        work = Path(work_dir)
        nodes = {}
        try:
            for mode, enabled in (("authorizer_on", "false" if args.control else "true"), ("authorizer_off", "false")):
                data_dir = work / mode / "data"
                (work / mode).mkdir()
                AclStore(str(data_dir)).create(acls(args.other_acls))
                # The topic is made before the authorizer is on: the load's principal may only WRITE.
                node = nodes[mode] = NodeProcess(work / mode, workers=args.workers, data_dir=data_dir).start()
                benchnode.create_topic("127.0.0.1", node.port, TOPIC, args.partitions)
                node.stop()
                node.config_path.write_text(f"[authorizer]\nenabled = {enabled}\n")
                node.announce = True
                node.start()
            for round_index, mode in rounds.steps():
                values = measure(nodes[mode], args)
                rounds.record(round_index, mode, values)
                print(f"{SCRIPT}: round {round_index} {mode}: "
                      + ", ".join(f"{k} {v:,.1f}" for k, v in values.items()), file=sys.stderr, flush=True)
        finally:
            for node in nodes.values():
                node.stop()
    report = {"script": SCRIPT, "workers": args.workers, "seconds": args.seconds, "other_acls": args.other_acls,
              "control": args.control,
              "metrics": {metric: rounds.compare(metric, 2) for metric in METRICS}}
    if args.json:
        print(json.dumps(report))
    else:
        for metric, summary in report["metrics"].items():
            print(f"{metric}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
