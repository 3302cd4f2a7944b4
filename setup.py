"""Builds shm._ringops, the compiled one-frame fast path of shm/ring.py, and workers.codecs._header, the
compiled request-header parser of workers/codecs/protocol.py, and installs the node's packages under
one `shmbroker` package (the rest is in pyproject.toml).

The repository keeps its top-level folders (node/, shm/, workers/, clients/: the design's layout); installed,
they are shmbroker.node, shmbroker.shm, shmbroker.workers and shmbroker.clients, so a user's own module named
`node` or `workers` (in the directory a program starts from, on its path) never shadows the node's code. The
code imports them by those names everywhere. `pyspark_shmbroker` stays a top-level package: Spark finds data
sources by that name, and it shadows nothing.

optional=True: without a C compiler the install still succeeds and both modules' users take their pure-Python
paths (correct, slower; `make` installs gcc and the Python headers when missing, and a test checks the build).
"""

from setuptools import Extension, find_packages, setup

PACKAGE = "shmbroker"
FOLDERS = ("node", "shm", "workers", "clients")  # each installed as shmbroker.<folder>
CONNECTOR = "pyspark_shmbroker"

setup(
    packages=[f"{PACKAGE}.{name}" for folder in FOLDERS for name in find_packages(include=[folder, f"{folder}.*"])]
    + find_packages(include=[CONNECTOR, f"{CONNECTOR}.*"]),
    package_dir={f"{PACKAGE}.{folder}": folder for folder in FOLDERS},
    ext_modules=[Extension(f"{PACKAGE}.shm._ringops", ["shm/_ringops.c"], optional=True),
                 Extension(f"{PACKAGE}.workers.codecs._header", ["workers/codecs/_header.c"], optional=True)],
)
