"""Builds shm._ringops, the compiled one-frame fast path of shm/ring.py (the rest is in pyproject.toml).

optional=True: without a C compiler the install still succeeds and shm.ring uses its pure-Python path
(correct, slower; `make` installs gcc and the Python headers when missing, and a test checks the build).
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("shm._ringops", ["shm/_ringops.c"], optional=True)])
