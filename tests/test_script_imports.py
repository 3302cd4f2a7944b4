"""Every script module (scripts/*.py, scripts/harness/*.py) imports in a Python that has only the node's own
dependencies, as `make venv` installs them (no test or spark extras): the benchmarks run there. The client wire
module (shmbroker.clients.wire), which the connector, the scripts and the tests speak through, is one of them:
importing it never imports pyspark.

How: the venv's Python (which has the extras too) runs the imports in a subprocess whose import system refuses
every top-level module that is neither the standard library's, nor the checkout's, nor one of a distribution the
node depends on: the closure of shmbroker's requirements without extras, read from its installed metadata, so a
dependency added to pyproject.toml counts as soon as `make` installs it. No pip and no build (a fresh venv costs
tens of seconds and the network); stricter than one too, as a module that only an extra's own dependencies bring
in is refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PROJECT = "shmbroker"
CHECKOUT_PACKAGES = ("shmbroker", "scripts", "pyspark_shmbroker")  # the connector's own import then needs pyspark
IMPORT_TIMEOUT_S = 120

# Run by the subprocess: argv[1] is the JSON list of the top-level modules it may import besides the standard
# library's, argv[2] the modules to import. Prints one JSON object: each module's import error (None: imported).
PROBE = """
import importlib, json, sys

allowed = set(json.loads(sys.argv[1])) | set(sys.stdlib_module_names)


class OnlyTheNodesDependencies:
    '''Refuses a top-level module that is not allowed, as a Python without it would.'''

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in allowed or top.startswith("__editable__"):
            return None
        raise ModuleNotFoundError(f"No module named {name!r} (not a dependency of the node)", name=top)


sys.meta_path.insert(0, OnlyTheNodesDependencies())
errors = {}
for module in json.loads(sys.argv[2]):
    try:
        importlib.import_module(module)
        errors[module] = None
    except Exception as error:
        errors[module] = f"{type(error).__name__}: {error}"
print(json.dumps(errors))
"""


def node_distributions() -> set[str]:
    """The distributions a plain `pip install shmbroker` brings: its requirements without extras, and theirs
    (with the extras they ask for), as installed here."""
    found: set[str] = set()
    todo = [(PROJECT, frozenset())]
    while todo:
        name, extras = todo.pop()
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (another platform's): nothing imports it
        found.add(canonicalize_name(name))
        for text in requires:
            requirement = Requirement(text)
            wanted = requirement.marker is None or any(requirement.marker.evaluate({"extra": extra})
                                                       for extra in extras or {""})
            if wanted and (canonicalize_name(requirement.name) not in found or requirement.extras):
                todo.append((requirement.name, frozenset(requirement.extras)))
    return found


def allowed_top_level_modules() -> list[str]:
    distributions = node_distributions()
    return sorted({module for module, owners in metadata.packages_distributions().items()
                   if any(canonicalize_name(owner) in distributions for owner in owners)} | set(CHECKOUT_PACKAGES))


def script_modules() -> list[str]:
    paths = sorted(REPO.glob("scripts/*.py")) + sorted(REPO.glob("scripts/harness/*.py"))
    return [".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for path in paths]


def import_with_the_nodes_dependencies_only(modules: list[str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(allowed_top_level_modules()), json.dumps(modules)],
                          cwd=REPO, capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_the_extras_are_not_the_nodes_dependencies():
    """What the probe refuses: the spark and test extras' packages; what it lets through: the node's own."""
    allowed = allowed_top_level_modules()
    assert {"kio", "numpy", "confluent_kafka", "psutil"} <= set(allowed)
    assert not {"pyspark", "pyarrow", "pandas", "trustme", "pytest", "matplotlib", "redis"} & set(allowed)


def test_every_script_module_imports_with_the_nodes_dependencies_only():
    modules = script_modules()
    assert "scripts.e2e_latency" in modules and "scripts.harness.rawkafka" in modules
    # The connector itself needs pyspark: the probe refuses it as a Python without the extras would.
    found = import_with_the_nodes_dependencies_only(["shmbroker.clients.wire", *modules, "pyspark_shmbroker"])
    errors = dict(found)
    assert errors.pop("pyspark_shmbroker") == ("ModuleNotFoundError: No module named 'pyspark' "
                                               "(not a dependency of the node)")
    assert {module: error for module, error in errors.items() if error is not None} == {}
