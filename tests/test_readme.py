"""README.md, the hand-written pages of docs/ and the example config say what the node does: every config key they
name is one the node accepts, every config section is listed, and the APIs docs/compatibility.md lists are exactly
those a running node advertises in ApiVersions, with the same version ranges. (The generated pages, configuration,
metrics and cli: tests/test_docs.py.)"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
from kio.schema.index import api_key_map

from shmbroker.node import config as node_config
from scripts.harness import rawkafka as R

REPO = Path(__file__).resolve().parent.parent
# The pages whose backticked `section.key` names are the node's settings: not the generated ones, nor
# compatibility.md, which names Kafka's (log.roll.ms, sasl.enabled.mechanisms: the same first words).
GENERATED = {f"{page}.md" for page in ("configuration", "metrics", "cli")}
COMPATIBILITY = (REPO / "docs" / "compatibility.md").read_text()
WRITTEN = [REPO / "README.md"] + sorted(p for p in (REPO / "docs").glob("*.md")
                                        if p.name not in GENERATED | {"compatibility.md"})
README = "\n\n".join(path.read_text() for path in WRITTEN)
SECTIONS = {f.name for f in dataclasses.fields(node_config.NodeConfig)}


def _paragraphs() -> list[str]:
    return [p for p in re.split(r"\n\s*\n", README)]


def _resolve(dotted: str) -> bool:
    """True if `dotted` (section.key or section.sub.key) names a setting of the node's config."""
    config: object = node_config.NodeConfig()
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(config) or part not in {f.name for f in dataclasses.fields(config)}:
            return False
        config = getattr(config, part)
    return True


def _backticked() -> list[str]:
    return re.findall(r"`([^`\n]+)`", README)


def test_every_dotted_setting_named_in_the_readme_exists():
    named = [t for t in _backticked() if re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)+", t) and t.split(".")[0] in SECTIONS]
    assert len(named) > 10, named  # the pages name settings this way throughout
    assert [t for t in named if not _resolve(t)] == []


def test_every_table_and_key_setting_named_in_the_readme_exists():
    # `[stats] enabled = false`: a table, one key and its value, in one line.
    inline = [re.fullmatch(r"\[([\w.]+)\] (\w+) = (.+)", t) for t in _backticked()]
    inline = [m for m in inline if m]
    assert inline
    for table, key, value in (m.groups() for m in inline):
        node_config.from_mapping(tomllib.loads(f"[{table}]\n{key} = {value}\n"))
    # "Settings in `[groups]`: `key` (default), ...": each backticked word is a key of that table.
    for paragraph in _paragraphs():
        listing = re.match(r"Settings in `\[(\w+)\]`", paragraph)
        if listing:
            keys = [t for t in re.findall(r"`([a-z_]+)`", paragraph)]
            assert keys and [k for k in keys if not _resolve(f"{listing.group(1)}.{k}")] == []


def test_every_toml_block_in_the_readme_and_the_example_config_loads():
    blocks = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert blocks
    for block in blocks:
        node_config.from_mapping(tomllib.loads(block))
    node_config.load(str(REPO / "systemd" / "shmbroker.toml"))


def test_the_configuration_section_lists_every_section():
    (listing,) = [p for p in _paragraphs() if "Sections:" in p]
    listed = set(re.findall(r"`\[([\w.]+)\]`", listing.split("Sections:", 1)[1]))
    assert {name.split(".")[0] for name in listed} == SECTIONS
    assert [name for name in listed if not _resolve(name)] == []


def _readme_apis() -> dict[str, tuple[int, int]]:
    (listing,) = [p for p in re.split(r"\n\s*\n", COMPATIBILITY) if p.startswith("Supported APIs")]
    body = listing.split(":", 1)[1]
    return {name: (int(low), int(high or low))
            for name, low, high in re.findall(r"\b([A-Z][A-Za-z]+) (\d+)(?:-(\d+))?", body)}


def _camel(snake: str) -> str:
    return "".join(part.capitalize() for part in snake.split("_"))


@pytest.mark.node
def test_the_readme_lists_exactly_the_apis_a_node_advertises(node):
    with R.RawConnection("127.0.0.1", node.port) as conn:
        response = conn.call(R.API_VERSIONS, 3, R.api_versions_body())
    advertised = {_camel(api_key_map[k.api_key]): (k.min_version, k.max_version) for k in response.api_keys}
    assert _readme_apis() == advertised
