# Two entry points: `make run` and `make test`. Everything they need is set up here,
# so a fresh Debian machine with only Python 3.11 and make is enough.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Debian packages, installed only when missing (root, or sudo when there is one).
APT_INSTALL = SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq

.PHONY: run test venv sysdeps clean install-service uninstall-service redis

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

# System packages the tests use, from the distribution, only when missing: kcat; a Java runtime for Spark
# (the JRE's post-install links its man page: slim images lack /usr/share/man/man1); tmux (the dashboard's
# test runs it in a pseudo-terminal); systemd-analyze (the unit's test verifies it).
sysdeps:
	@command -v kcat >/dev/null 2>&1 || { $(APT_INSTALL) kcat; }
	@$(JAVA_OK) || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO mkdir -p /usr/share/man/man1; \
		$(APT_INSTALL) openjdk-17-jre-headless; }
	@command -v tmux >/dev/null 2>&1 || { $(APT_INSTALL) tmux; }
	@command -v systemd-analyze >/dev/null 2>&1 || { $(APT_INSTALL) systemd; }

# Redis for scripts/bench_report.py's side-by-side runs (redis-server and redis-benchmark).
redis:
	@{ command -v redis-server >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } || { $(APT_INSTALL) redis-server redis-tools; }

# The node as a systemd service (as root): code and venv in $(PREFIX), the unit, its user (sysusers.d), its
# directories (tmpfiles.d), the example config (kept if one is there), then `systemctl enable --now shmbroker`.
PREFIX ?= /opt/shmbroker
install-service:
	@test "$$(id -u)" = 0 || { echo "make install-service: run as root"; exit 1; }
	mkdir -p $(PREFIX)
	cp -r pyproject.toml setup.py README.md node shm workers $(PREFIX)/
	$(PYTHON) -m venv $(PREFIX)/.venv
	$(PREFIX)/.venv/bin/pip install --quiet $(PREFIX)
	install -m 0644 systemd/shmbroker.sysusers /usr/lib/sysusers.d/shmbroker.conf
	install -m 0644 systemd/shmbroker.tmpfiles /usr/lib/tmpfiles.d/shmbroker.conf
	systemd-sysusers /usr/lib/sysusers.d/shmbroker.conf
	systemd-tmpfiles --create /usr/lib/tmpfiles.d/shmbroker.conf
	test -e /etc/shmbroker/shmbroker.toml || install -m 0644 systemd/shmbroker.toml /etc/shmbroker/shmbroker.toml
	install -m 0644 systemd/shmbroker.service /etc/systemd/system/shmbroker.service
	systemctl daemon-reload
	systemctl enable --now shmbroker
	@echo "shmbroker: installed; status: systemctl status shmbroker; stats: $(PREFIX)/.venv/bin/shmbroker stats --data-dir /var/lib/shmbroker/data"

uninstall-service:
	@test "$$(id -u)" = 0 || { echo "make uninstall-service: run as root"; exit 1; }
	-systemctl disable --now shmbroker
	rm -f /etc/systemd/system/shmbroker.service /usr/lib/sysusers.d/shmbroker.conf /usr/lib/tmpfiles.d/shmbroker.conf
	systemctl daemon-reload
	@echo "shmbroker: unit removed; data in /var/lib/shmbroker, config in /etc/shmbroker and $(PREFIX) are kept"

# The node on 127.0.0.1:9092 with its data in ./data, until Ctrl-C (a clean stop).
run: venv
	$(VENV)/bin/shmbroker serve --listen 127.0.0.1:9092 --data-dir ./data

test: venv sysdeps redis
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info shm/*.so
