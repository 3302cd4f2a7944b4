# Two entry points: `make run` and `make test`. Everything they need is set up here,
# so a fresh Debian machine with only Python 3.11 and make is enough.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages, installed only when missing (root, or sudo when there is one).
APT_INSTALL = SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq

.PHONY: run test venv sysdeps clean

# The C compiler and Python headers build shm/_ringops.c, the ring's compiled one-frame paths.
HAVE_PY_HEADERS = $(PYTHON) -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
PY_DEV_PACKAGE = python$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-dev

$(STAMP): pyproject.toml setup.py shm/_ringops.c
	@test -n "$(PYTHON)" || { echo "make: Python 3.11 is needed"; exit 1; }
	@{ command -v gcc >/dev/null 2>&1 && $(HAVE_PY_HEADERS); } || { $(APT_INSTALL) gcc $(PY_DEV_PACKAGE); } || { $(APT_INSTALL) gcc python3-dev; }
	@# Debian ships venv's pip bootstrap separately (python3-venv, which pulls python3.11-venv).
	$(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); $(APT_INSTALL) python3-venv; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,spark]'
	touch $(STAMP)

venv: $(STAMP)

# A Java 17+ runtime for Spark (pyspark 4 needs one): the one on PATH, or Debian's Java 17 (which
# scripts/sparkjob.py finds by itself when an older java comes first on PATH).
JAVA_OK = { command -v java >/dev/null 2>&1 && java -XX:-UsePerfData -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|[2-9][0-9])[."]'; } \
	|| ls /usr/lib/jvm/java-17-openjdk-*/bin/java >/dev/null 2>&1

# System packages the tests use (kcat, a Java runtime for Spark), from the distribution, only when missing.
# The JRE's post-install links its man page: slim images lack /usr/share/man/man1.
sysdeps:
	@command -v kcat >/dev/null 2>&1 || { $(APT_INSTALL) kcat; }
	@$(JAVA_OK) || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO mkdir -p /usr/share/man/man1; \
		$(APT_INSTALL) openjdk-17-jre-headless; }

# The node on 127.0.0.1:9092 with its data in ./data, until Ctrl-C (a clean stop).
run: venv
	$(VENV)/bin/shmbroker serve --listen 127.0.0.1:9092 --data-dir ./data

test: venv sysdeps
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info shm/*.so
