"""The house rules of the imports: layers point down (workers -> node -> shm), each room imports only the rooms
its rule names, client packages import nothing of the server, and no module imports itself back through a cycle.

Every import statement counts, wherever it stands: at the top, inside a function, under TYPE_CHECKING
(a cycle hidden there is still a cycle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("node", "shm", "workers", "clients", "pyspark_shmbroker")
FOLDERS = ("node", "shm", "workers", "clients")  # installed as shmbroker.node and so on (setup.py)
INSTALLED_AS = "shmbroker."  # and imported by that name

# Modules of node's root that every process may use.
SHARED = ("node.config", "node.logging_setup", "node.proctitle", "node.child")
# What the Spark connector may import of the server: the record-batch codec it shares with the node (batch
# headers, codecs, every record's fields as arrays), modules that import nothing else of the node.
CONNECTOR_SHARES: tuple[str, ...] = ("node.storage.records", "node.storage.record_arrays", "node.storage.compression")
# The client code the connector speaks Kafka's protocol through (the benchmarks and the tests too).
CLIENT_WIRE = "clients.wire"

# One rule per room: what it may import besides its own modules. A module's room is the longest key here
# that a module falls under, so "node" is the supervisor side (node's root) and "workers" the workers' base
# (connection, eventloop, memory, limits, affinity), neither their sub-rooms. A name allows a room, or only
# the modules under it where it names less than a room ("node.storage.records").
RULES: dict[str, tuple[str, ...]] = {
    "shm": (),
    "node.storage": ("shm",),
    "node.config": ("shm", "node.storage"),  # not node.timer nor node.tools: every process imports it
    "node.logging_setup": (),
    "node.proctitle": (),
    "node.timer": ("shm", "node.storage") + SHARED,
    "node.cleaner": ("shm", "node.storage") + SHARED,  # the log cleaner process
    "node": ("shm", "node.storage") + SHARED,  # the supervisor side: runs the timer and the workers, imports
                                                # neither, nor node.tools
    "node.tools": ("shm", "node.storage", "node") + SHARED,  # `serve` starts the supervisor
    "workers.codecs": (),  # the Kafka wire format only
    "workers.timer_client": ("shm", "workers"),
    "workers.api": ("shm", "node.storage", "workers", "workers.codecs", "workers.timer_client") + SHARED,
    "workers.worker": ("shm", "node.storage", "workers", "workers.codecs", "workers.timer_client",
                       "workers.api") + SHARED,
    "workers": ("shm",) + SHARED,
    "clients": (),
    "pyspark_shmbroker": CONNECTOR_SHARES + (CLIENT_WIRE,),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def project_modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    modules = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")) if (root / package).is_dir() else ():
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `module` imports (a `from package import name` counts as package.name if that
    is a module, else as the package)."""
    found = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name.removeprefix(INSTALLED_AS) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (node.module or "").removeprefix(INSTALLED_AS)
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:  # import a.b.c of a module a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def room_of(module: str) -> str | None:
    rooms = [room for room in RULES if _within(module, room)]
    return max(rooms, key=len) if rooms else None


def allowed(module: str, target: str) -> bool:
    room = room_of(module)
    return room_of(target) == room or any(_within(target, name) and room_of(target) == room_of(name)
                                          for name in RULES.get(room, ()))


def layering_breaches(root: Path) -> list[str]:
    modules = project_modules(root)
    return sorted(f"{module} imports {target}"
                  for module, path in modules.items()
                  for target in imports_of(module, path, modules)
                  if not allowed(module, target))


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan), each a cycle of imports."""
    modules = project_modules(root)
    graph = {module: sorted(imports_of(module, path, modules)) for module, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(start: str) -> None:
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == module:
                            break
                    if len(group) > 1:
                        cycles.append(sorted(group))

    for module in graph:
        if module not in index:
            visit(module)
    return cycles


def test_layers_point_down():
    assert layering_breaches(REPO) == []


def test_no_import_cycles():
    assert import_cycles(REPO) == []


def test_the_codec_the_connector_shares_imports_nothing_else_of_the_node():
    """What the connector imports of the node pulls in nothing more of it."""
    modules = project_modules(REPO)
    for module in CONNECTOR_SHARES:
        assert imports_of(module, modules[module], modules) <= set(CONNECTOR_SHARES), module


def test_every_room_has_modules():
    """A rule whose room was renamed or moved would check nothing."""
    modules = project_modules(REPO)
    assert [room for room in RULES if not any(_within(module, room) for module in modules)] == []


def test_the_checks_catch_a_breach_and_a_cycle(tmp_path):
    """The two tests above can fail: a tree with a breach and a cycle is reported."""
    files = {
        "shm/__init__.py": "", "shm/ring.py": "import numpy\n",
        "node/__init__.py": "", "node/timer/__init__.py": "", "node/timer/wheel.py": "",
        "node/timer/process.py": "from workers.timer_client.delayed import DelayedRequests\n",  # upward
        "node/config.py": "from node.timer.wheel import WheelConfig\n",  # config imports the timer
        "node/supervisor.py": "from node.tools import metrics\n",  # the supervisor imports a tool
        "node/tools/__init__.py": "", "node/tools/metrics.py": "", "node/storage/log.py": "",
        "workers/__init__.py": "",
        "workers/timer_client/delayed.py": "from shm import ring\n",
        "workers/worker.py": "from node.supervisor import x\nfrom workers.api import handlers\n",  # supervisor module
        "workers/api/handlers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workers.worker import W\n",
        "workers/codecs/protocol.py": "from workers.api import handlers\n",  # a codec imports a handler
        "clients/__init__.py": "", "clients/priority.py": "import shm.ring\n",  # client imports the server
        "pyspark_shmbroker/records.py": "from node.storage import log\n",  # the connector imports the node's log
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert layering_breaches(tmp_path) == [
        "clients.priority imports shm.ring",
        "node.config imports node.timer.wheel",
        "node.supervisor imports node.tools.metrics",
        "node.timer.process imports workers.timer_client.delayed",
        "pyspark_shmbroker.records imports node.storage.log",
        "workers.api.handlers imports workers.worker",
        "workers.codecs.protocol imports workers.api.handlers",
        "workers.worker imports node.supervisor",
    ]
    assert import_cycles(tmp_path) == [["workers.api.handlers", "workers.worker"]]


def test_a_rule_can_share_one_module_of_a_room(monkeypatch):
    """Naming a module, not its room, allows that module only (how the connector will share a codec)."""
    monkeypatch.setitem(RULES, "pyspark_shmbroker", ("node.storage.records",))
    assert allowed("pyspark_shmbroker.records", "node.storage.records")
    assert not allowed("pyspark_shmbroker.records", "node.storage.log")
    assert not allowed("pyspark_shmbroker.records", "shm.table")


def bare_imports(root: Path) -> list[str]:
    """Imports of a repository folder by its bare name (node.x, not shmbroker.node.x): it works in the checkout,
    whose root is on the path, and fails, or imports a user's own module, where the wheel is installed."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(part.startswith(".") for part in parts) or parts[0] in ("build", "dist"):
            continue  # the venv, the frameworks' npm packages, setuptools' copies of the sources
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found += [f"{path.relative_to(root)}:{node.lineno} imports {name}" for name in names
                      if name.split(".")[0] in FOLDERS]
    return found


def test_every_import_of_the_node_uses_its_installed_name(tmp_path):
    assert bare_imports(REPO) == []
    (tmp_path / "script.py").write_text("import shmbroker.node.config\nfrom workers import worker\n")
    assert bare_imports(tmp_path) == ["script.py:2 imports workers"]
