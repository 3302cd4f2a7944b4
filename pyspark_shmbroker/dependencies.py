"""The connector's dependencies beyond pyspark, imported in one place so that a Python without them says
what to do.

Spark runs the connector's code in Python workers started with PYSPARK_PYTHON, or `python3` on PATH when
that is unset: without the venv activated, that is a Python other than the one shmbroker[spark] was
installed into, which lacks kio, pyarrow and the rest.

Invariants:
- Every module of the connector that imports one of ``REQUIRED`` imports this module first.
- Importing it succeeds where every module of ``REQUIRED`` imports; otherwise it raises
  ModuleNotFoundError naming each missing module, the Python that lacks it (sys.executable) and the fix.
- It imports nothing of pyspark or of the connector, so nothing else fails before its check.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

REQUIRED = ("kio", "cramjam", "crc32c", "numpy", "pyarrow")


def missing_message(missing: dict[str, str]) -> str:
    """The message for the modules of `missing` (name -> its import error) that this Python lacks."""
    python = sys.executable
    # A checkout set up with `make test-venv` has its venv next to the package: name it when it exists.
    checkout_venv = Path(__file__).resolve().parent.parent / ".venv" / "bin" / "python"
    venv_python = (str(checkout_venv) if checkout_venv.exists() and str(checkout_venv) != python
                   else "<venv>/bin/python")
    # A module that is there but fails to import says why.
    broken = [error for name, error in missing.items() if error != f"No module named {name!r}"]
    why = f" ({'; '.join(broken)})" if broken else ""
    return (f"pyspark_shmbroker needs {', '.join(missing)}, which the Python {python} lacks{why}. Spark runs "
            f"its Python workers with PYSPARK_PYTHON, or `python3` on PATH when that is unset: run Spark with the "
            f"Python of the venv where shmbroker[spark] is installed: activate that venv before starting Spark, "
            f"or set PYSPARK_PYTHON={venv_python}")


def _check() -> None:
    missing = {}
    for name in REQUIRED:
        try:
            importlib.import_module(name)
        except ImportError as error:
            missing[name] = str(error)
    if missing:
        raise ModuleNotFoundError(missing_message(missing), name=next(iter(missing)))


_check()
