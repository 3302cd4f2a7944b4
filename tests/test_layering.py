"""The house rules of the imports: layers point down (workers -> node -> shm), children do not import the
supervisor's modules, client packages import nothing of the server, and no module imports itself back
through a cycle.

Every import statement counts, wherever it stands: at the top, inside a function, under TYPE_CHECKING
(a cycle hidden there is still a cycle in the design).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("node", "shm", "workers", "clients", "pyspark_shmbroker")

# The supervisor's own modules: only the supervisor side (node's root) imports them.
SUPERVISOR = ("node.supervisor", "node.tools.cli", "node.resources", "node.sdnotify")
# Modules of node's root that every process may use.
SHARED = ("node.config", "node.logging_setup", "node.proctitle")
SERVER = ("node", "shm", "workers")

# Most specific prefix first: (module prefix, what it may import of the project's packages).
RULES: list[tuple[str, tuple[str, ...]]] = [
    ("shm", ("shm",)),
    ("node.storage", ("shm", "node.storage")),
    ("node.timer", ("shm", "node.storage", "node.timer") + SHARED),
    ("node.config", ("shm", "node.storage", "node.timer", "node.config")),
    ("node.logging_setup", ()),
    ("node.proctitle", ()),
    ("node", ("shm", "node")),
    ("workers", ("shm", "node.storage", "workers") + SHARED),
    ("clients", ("clients",)),
    ("pyspark_shmbroker", ("pyspark_shmbroker",)),
]


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
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
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


def allowed(module: str, target: str) -> bool:
    supervisor_side = _within(module, "node") and not any(
        _within(module, p) for p in ("node.storage", "node.timer") + SHARED)
    if any(_within(target, s) for s in SUPERVISOR) and not supervisor_side:
        return False
    for prefix, may_import in RULES:
        if _within(module, prefix):
            return any(_within(target, p) for p in may_import)
    return True


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


def test_the_checks_catch_a_breach_and_a_cycle(tmp_path):
    """The two tests above can fail: a tree with a breach and a cycle is reported."""
    files = {
        "shm/__init__.py": "", "shm/ring.py": "import numpy\n",
        "node/__init__.py": "", "node/timer/__init__.py": "",
        "node/timer/process.py": "from workers.timer_client.link import TimerLink\n",  # upward
        "node/supervisor.py": "",
        "workers/__init__.py": "",
        "workers/timer_client/link.py": "from shm import ring\n",
        "workers/worker.py": "from node.supervisor import x\nfrom workers.api import handlers\n",  # supervisor module
        "workers/api/handlers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from workers.worker import W\n",
        "clients/__init__.py": "", "clients/priority.py": "import shm.ring\n",  # client imports the server
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert layering_breaches(tmp_path) == [
        "clients.priority imports shm.ring",
        "node.timer.process imports workers.timer_client.link",
        "workers.worker imports node.supervisor",
    ]
    assert import_cycles(tmp_path) == [["workers.api.handlers", "workers.worker"]]
