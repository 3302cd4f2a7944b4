"""Alternating rounds of two modes (ABBA): what a setting costs, measured against its baseline in one run.

A benchmark names two modes, A (measured) and B (its baseline), and a number of rounds; each round measures
both, one after the other, in the order ``order(round)``: A then B in even rounds, B then A in odd ones, so
over two rounds each mode goes first once and a drift of the shared machine hits both alike.

The figure of a metric is its ratio A / B: the median over rounds of each round's own ratio (two
measurements taken seconds apart), with the smallest and largest; each mode's median is given beside it.
A round whose B value is 0 has no ratio. Ratios are rounded to 4 decimals.

The benchmarks built on it share their command line's start (``ab_parser``: --runs, --workers, --json),
the line each step logs (``log_step``) and the report's output (``print_report``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Iterator

from scripts.harness.benchnode import DEFAULT_WORKERS

RATIO_DIGITS = 4


class AlternatingRounds:
    def __init__(self, a: str, b: str, rounds: int) -> None:
        if rounds < 1:
            raise ValueError("at least one round")
        self.modes = (a, b)
        self.rounds = rounds
        self.measured: dict[str, list[dict[str, float]]] = {a: [], b: []}

    def order(self, round_index: int) -> tuple[str, str]:
        a, b = self.modes
        return (a, b) if round_index % 2 == 0 else (b, a)

    def steps(self) -> Iterator[tuple[int, str]]:
        """(round, mode) in the order they are measured."""
        for round_index in range(self.rounds):
            for mode in self.order(round_index):
                yield round_index, mode

    def record(self, round_index: int, mode: str, values: dict[str, float]) -> None:
        """The metrics of `mode` in round `round_index`; each mode's rounds are recorded in order."""
        if len(self.measured[mode]) != round_index:
            raise ValueError(f"{mode}: round {round_index} recorded out of order")
        self.measured[mode].append(dict(values))

    def values(self, mode: str, metric: str) -> list[float]:
        return [round_values[metric] for round_values in self.measured[mode]]

    def median(self, mode: str, metric: str) -> float:
        return statistics.median(self.values(mode, metric))

    def _ratios(self, metric: str) -> list[float]:
        a, b = self.modes
        return [x / y for x, y in zip(self.values(a, metric), self.values(b, metric)) if y]

    def ratios(self, metric: str) -> list[float]:
        """Each complete round's A / B, in round order."""
        return [round(ratio, RATIO_DIGITS) for ratio in self._ratios(metric)]

    def ratio(self, metric: str) -> float | None:
        ratios = self._ratios(metric)
        return round(statistics.median(ratios), RATIO_DIGITS) if ratios else None

    def compare(self, metric: str, digits: int = RATIO_DIGITS) -> dict:
        """A metric's figure: the ratio's median, min and max, and each mode's median and values (rounded to
        `digits` decimals)."""
        ratios = self.ratios(metric)
        figure: dict = {f"{mode}_median": round(self.median(mode, metric), digits) for mode in self.modes}
        figure.update(ratio_median=self.ratio(metric), ratio_min=min(ratios, default=None),
                      ratio_max=max(ratios, default=None))
        figure.update({mode: [round(v, digits) for v in self.values(mode, metric)] for mode in self.modes})
        return figure


def ab_parser(script: str, description: str, runs: int, runs_help: str, json_help: str) -> argparse.ArgumentParser:
    """The command line of an A/B benchmark `scripts.<script>`: --runs (rounds, default `runs`), --workers of its
    node and --json; the benchmark adds its own options."""
    parser = argparse.ArgumentParser(prog=f"python -m scripts.{script}", description=description.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=runs, help=runs_help)
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--json", action="store_true", help=json_help)
    return parser


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """A raw pipelined load's options: --seconds per step, --partitions of its topic, --connections and
    --inflight requests on each."""
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each measurement")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--inflight", type=int, default=8)


def log_step(script: str, round_index: int, mode: str, values: dict[str, float]) -> None:
    """One measured step on stderr (stdout carries the report)."""
    print(f"{script}: round {round_index} {mode}: " + ", ".join(f"{k} {v:,.1f}" for k, v in values.items()),
          file=sys.stderr, flush=True)


def print_report(report: dict, as_json: bool) -> None:
    """The report (its "metrics": each metric's figure from ``compare``): one JSON document, or a line per metric."""
    if as_json:
        print(json.dumps(report))
    else:
        for metric, summary in report["metrics"].items():
            print(f"{metric}: {summary}")
