"""What the authorizer costs on the produce path: raw producer records/s with `[authorizer] enabled = true` and one
ALLOW ACL per client against the authorizer off, on one node, in one run.

One node (scripts/harness/nodeproc.py, --workers workers). Its load connections' principal (User:ANONYMOUS, the
principal of a PLAINTEXT listener) has one ALLOW ACL, WRITE on its topic, among --other-acls ACLs of other
principals and topics (so a decision searches a real set). Between steps the authorizer is turned on or off by
its config and SIGHUP (`[authorizer]` is reloaded by every worker; the step starts once each worker logged it),
so both modes run the same processes, files and memory: two nodes differ by more than the authorizer (an A/A
run of two nodes showed 2-3% either way). Rounds alternate the two modes (scripts/harness/abba.py: ABBA order;
each ratio on/off is the median of the rounds' own ratios). Each step runs scripts.producer_perf's raw load
generator (pre-encoded batches, --connections sockets, --inflight requests each) for --seconds: records/s and
the workers' CPU per 1,000 records. Any error code in a response fails the run (a refused produce would measure
nothing). --control: both modes keep the authorizer off (still reloaded between modes): the bench's own noise.

    .venv/bin/python -m scripts.bench_authorizer [--runs 6] [--seconds 5] [--workers 2] [--json]

Only 127.0.0.1 is used; every measurement and wait is bounded in time; the node is stopped by pid.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

from shmbroker.node.storage.acls import AclBinding, AclStore, Operation, PatternType, Permission, ResourceType
from scripts.harness import abba, benchnode
from scripts.harness.nodeproc import NodeProcess
from scripts.producer_perf import RawProduceLoad, run_raw_producer

SCRIPT = "bench_authorizer"
METRICS = ("records_per_s", "worker_cpu_us_per_1k_records")
TOPIC = "bench-authorizer"
PRINCIPAL = "User:ANONYMOUS"
RELOADED = "reloaded quotas and the authorizer"  # what a worker logs once it took a SIGHUP's config
RELOAD_TIMEOUT_S = 30.0
# The config of each mode. The control's two differ in a setting the load never reaches (a bound of the
# connections' decision caches), so that it reloads between modes as the real run does.
SETTINGS = {"authorizer_on": "[authorizer]\nenabled = true\n", "authorizer_off": "[authorizer]\nenabled = false\n"}
CONTROL_SETTINGS = {"authorizer_on": "[authorizer]\nenabled = false\ncache_entries_per_connection = 4096\n",
                    "authorizer_off": SETTINGS["authorizer_off"]}


def acls(other: int) -> list[AclBinding]:
    """The load's one ALLOW, and `other` ACLs of other principals and topics (literal and prefixed)."""
    mine = [AclBinding(ResourceType.TOPIC, TOPIC, PatternType.LITERAL, PRINCIPAL, "*", Operation.WRITE,
                       Permission.ALLOW)]
    return mine + [AclBinding(ResourceType.TOPIC, f"other-{i}", PatternType.PREFIXED if i % 4 == 0 else
                              PatternType.LITERAL, f"User:client-{i}", "*", Operation.WRITE, Permission.ALLOW)
                   for i in range(other)]


def reload_config(node: NodeProcess, config: str, reloads_expected: int) -> None:
    """Write the node's config, SIGHUP it, and wait until every worker has reloaded (each logs RELOADED once per
    SIGHUP that changed a reloadable setting: `reloads_expected` lines in all)."""
    node.config_path.write_text(config)
    os.kill(node.proc.pid, signal.SIGHUP)
    deadline = time.monotonic() + RELOAD_TIMEOUT_S
    while node.log(chars=10**7).count(RELOADED) < reloads_expected:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not reload the authorizer in {RELOAD_TIMEOUT_S} s:\n{node.log()}")
        time.sleep(0.05)


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
    parser = abba.ab_parser(SCRIPT, __doc__, 6, "rounds: a step of each mode", "one JSON document on stdout")
    abba.add_pipeline_arguments(parser)
    parser.add_argument("--other-acls", type=int, default=1000, help="ACLs of other principals on the node")
    parser.add_argument("--control", action="store_true",
                        help="the authorizer off in both modes (an A/A run: the bench's own noise)")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0 or args.other_acls < 0:
        parser.error("--runs and --seconds must be positive, --other-acls at least 0")
    rounds = abba.AlternatingRounds("authorizer_on", "authorizer_off", args.runs)
    settings = CONTROL_SETTINGS if args.control else SETTINGS
    with tempfile.TemporaryDirectory(prefix="bench-authorizer-") as work_dir:
        work = Path(work_dir)
        data_dir = work / "data"
        AclStore(str(data_dir)).create(acls(args.other_acls))
        # The topic is made while the authorizer is off: the load's principal may only WRITE.
        node = NodeProcess(work, workers=args.workers, data_dir=data_dir, config=SETTINGS["authorizer_off"],
                           announce=True).start()
        try:
            benchnode.create_topic("127.0.0.1", node.port, TOPIC, args.partitions)
            reloads, current = 0, SETTINGS["authorizer_off"]
            for round_index, mode in rounds.steps():
                if settings[mode] != current:
                    reloads += 1
                    current = settings[mode]
                    reload_config(node, current, reloads * args.workers)
                values = measure(node, args)
                rounds.record(round_index, mode, values)
                abba.log_step(SCRIPT, round_index, mode, values)
        finally:
            node.stop()
    report = {"script": SCRIPT, "workers": args.workers, "seconds": args.seconds, "other_acls": args.other_acls,
              "control": args.control, "reloads": reloads,
              "metrics": {metric: rounds.compare(metric, 2) for metric in METRICS}}
    abba.print_report(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
