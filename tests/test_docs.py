"""The reference pages of docs/ are what node/tools/docgen.py makes of the code (`make docs` writes them), and they
agree with the node: every configuration key the page lists is one the node takes, at the default the page gives;
every key has help text in the code; the command-line page is what `shmbroker ... --help` prints. (The metrics page
against a live /metrics: tests/test_stats_cli.py's test_prometheus_endpoint.)"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from shmbroker.node import config as node_config
from shmbroker.node.tools import docgen
from scripts.harness.nodeproc import CLI

DOCS = Path(__file__).resolve().parent.parent / "docs"


def documented_series() -> set[str]:
    """The Prometheus series docs/metrics.md lists, as /metrics names them (a counter with `_total`)."""
    table = (DOCS / "metrics.md").read_text().split("## Prometheus series", 1)[1].split("\n## ", 1)[0]
    return {name + ("_total" if kind == "counter" else "")
            for name, kind in re.findall(r"^\| `(\w+)` \| (\w+) \|", table, re.M)}


@pytest.mark.parametrize("page", docgen.PAGES)
def test_the_committed_page_is_what_the_code_makes(page):
    assert (DOCS / f"{page}.md").read_text() == docgen.page(page), f"docs/{page}.md is stale: run `make docs`"


def test_every_config_key_has_help_in_the_code():
    assert docgen.missing_help() == []


def _documented_keys() -> list[tuple[str, str, str]]:
    """(table header, key, default as written) of every row of docs/configuration.md."""
    rows, header = [], None
    for line in (DOCS / "configuration.md").read_text().splitlines():
        heading = re.fullmatch(r"## `(.+)`", line)
        if heading:
            header = heading.group(1)
        row = re.match(r"\| `(\w+)` \| \w+ \| `([^`]*)`", line)
        if row:
            rows.append((header, row.group(1), row.group(2)))
    return rows


def _table(header: str, key: str, value: str) -> str:
    """A TOML file that sets `key` to `value` in the table `header` names."""
    if header.startswith("[["):
        others = "".join(f"{k} = {v}\n" for k, v in (("name", '"DOC"'), ("address", '"127.0.0.1:1"')) if k != key)
        return f"{header}\n{others}{key} = {value}\n"
    return f"{header.replace('NAME', 'doc')}\n{key} = {value}\n"


def _setting(config: node_config.NodeConfig, header: str, key: str):
    table = config
    for part in header.strip("[]").split("."):
        table = table[0] if isinstance(table, list) else getattr(table, part)
    if isinstance(table, list):
        table = table[0]
    return getattr(table.get("doc") if isinstance(table, dict) else table, key)


def test_every_documented_key_is_taken_by_the_node_at_its_documented_default(tmp_path):
    """Each row's key and default, alone in a file: the node loads it, and the setting then equals the node's
    default (an empty file's), so the page gives the true default in a form the node takes."""
    rows = _documented_keys()
    defaults = node_config.load(None)
    sections = {header for header, _, _ in rows}
    assert {"[server]", "[[listeners]]", '[quotas.clients."NAME"]', "[timer.wheel]"} <= sections
    assert len(rows) > 150
    for header, key, default in rows:
        path = tmp_path / "node.toml"
        path.write_text(_table(header, key, default))
        loaded = node_config.load(str(path))  # an unknown key, a wrong type or a refused value raises ConfigError
        if header.startswith("[[") or "NAME" in header:
            continue  # a listener or a client's quotas: the class's own defaults, no node default to compare
        assert _setting(loaded, header, key) == _setting(defaults, header, key), (header, key, default)
    # And a key the page does not list is refused, so the page's keys are not merely accepted by anything.
    path.write_text("[server]\nno_such_key = 1\n")
    with pytest.raises(node_config.ConfigError):
        node_config.load(str(path))


def test_the_cli_page_is_what_the_command_prints():
    text = (DOCS / "cli.md").read_text()
    blocks = dict(re.findall(r"^## (shmbroker[\w -]*)\n\n```\n(.*?)\n```", text, re.M | re.S))
    assert {"shmbroker", "shmbroker serve", "shmbroker topics create"} <= set(blocks)
    env = {**os.environ, "COLUMNS": str(docgen.HELP_COLUMNS)}
    for command in ("shmbroker", "shmbroker serve", "shmbroker topics create"):
        printed = subprocess.run(CLI + command.split()[1:] + ["--help"], capture_output=True, text=True, env=env,
                                 timeout=30, check=True).stdout
        assert printed.rstrip() == blocks[command]
