# Two entry points: `make run` and `make test`. Everything they need is set up here,
# so a fresh Debian machine with only Python 3.11 and make is enough.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# Bytecode is written (__pycache__, git-ignored) even where the shell asks for none: without it every node process
# compiled the node's sources again at its start (0.45 s of CPU each, hundreds of starts in `make test`) and every
# pytest process rewrote every test module (6 s of CPU each).
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# Debian packages, installed only when missing (root, or sudo when there is one).
APT_INSTALL = SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq

.PHONY: run test check docs venv test-venv wheel sysdeps clean install-service uninstall-service redis kafka \
	librdkafka

# The C compiler and Python headers build shm/_ringops.c, the ring's compiled one-frame paths, and
# workers/codecs/_header.c, the request-header parser.
HAVE_PY_HEADERS = $(PYTHON) -c "import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))"
PY_DEV_PACKAGE = python$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])')-dev

# `make run` needs the node's own dependencies only; `make test` adds the test and Spark extras. The install is
# editable: setuptools' finder maps shmbroker.node, shmbroker.shm, ... to the checkout's folders (setup.py). A
# .pth file also puts the checkout on sys.path, so that pkgutil.iter_modules() sees pyspark_shmbroker from any
# directory, as Spark's data source lookup needs (the finder's packages are invisible to it).
SITE_PACKAGES = $$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# One install per target: `make test` on a fresh checkout builds the editable wheel (and resolves) once, not
# once for the node and again for its extras. --no-compile: Python writes each module's bytecode at its first
# import, as it would anyway; pip compiling every file of every package (pyspark's thousands) up front took 15 of
# the test venv's 26 s of CPU.
PIP_INSTALL = $(PY) -m pip install --quiet --no-compile
define NEW_VENV
	@test -n "$(PYTHON)" || { echo "make: Python 3.11 is needed"; exit 1; }
	@{ command -v gcc >/dev/null 2>&1 && $(HAVE_PY_HEADERS); } || { $(APT_INSTALL) gcc $(PY_DEV_PACKAGE); } || { $(APT_INSTALL) gcc python3-dev; }
	@# Debian ships venv's pip bootstrap separately (python3-venv, which pulls python3.11-venv).
	test -x $(PY) || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); $(APT_INSTALL) python3-venv; $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
endef

$(STAMP): pyproject.toml setup.py shm/_ringops.c workers/codecs/_header.c
	$(NEW_VENV)
	$(PIP_INSTALL) -e .
	echo "$(CURDIR)" > "$(SITE_PACKAGES)/shmbroker-checkout.pth"
	touch $(STAMP)

$(TEST_STAMP): pyproject.toml setup.py shm/_ringops.c workers/codecs/_header.c
	$(NEW_VENV)
	$(PIP_INSTALL) -e '.[test,spark]'
	echo "$(CURDIR)" > "$(SITE_PACKAGES)/shmbroker-checkout.pth"
	touch $(STAMP) $(TEST_STAMP)

venv: $(STAMP)
test-venv: $(TEST_STAMP)

# A Java 17+ runtime for Spark (pyspark 4 needs one): the one on PATH, or Debian's Java 17 (which
# scripts/harness/sparkjob.py finds by itself when an older java comes first on PATH).
JAVA_OK = { command -v java >/dev/null 2>&1 && java -XX:-UsePerfData -version 2>&1 | head -1 | grep -Eq '"(1[7-9]|[2-9][0-9])[."]'; } \
	|| ls /usr/lib/jvm/java-17-openjdk-*/bin/java >/dev/null 2>&1

# System packages the tests use, from the distribution, only when missing: kcat; a Java runtime for Spark
# (the JRE's post-install links its man page: slim images lack /usr/share/man/man1); tmux (the dashboard's
# test runs it in a pseudo-terminal); systemd-analyze (the unit's test verifies it); Node.js and npm (the KafkaJS
# test installs kafkajs from the npm registry and runs it with node).
sysdeps:
	@command -v kcat >/dev/null 2>&1 || { $(APT_INSTALL) kcat; }
	@$(JAVA_OK) || { SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; $$SUDO mkdir -p /usr/share/man/man1; \
		$(APT_INSTALL) openjdk-17-jre-headless; }
	@command -v tmux >/dev/null 2>&1 || { $(APT_INSTALL) tmux; }
	@command -v systemd-analyze >/dev/null 2>&1 || { $(APT_INSTALL) systemd; }
	@{ command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; } || { $(APT_INSTALL) nodejs npm; }
	@command -v mvn >/dev/null 2>&1 || { $(APT_INSTALL) maven; }
	@# librdkafka's test-runner (make librdkafka): a C++ compiler and zlib's headers.
	@command -v g++ >/dev/null 2>&1 || { $(APT_INSTALL) g++; }
	@[ -e /usr/include/zlib.h ] || { $(APT_INSTALL) zlib1g-dev; }

# Apache Kafka 4.4.0, the node's peer in the benchmarks and the differential tests: its jars, fetched by Maven
# from scripts/harness/kafka/pom.xml into ~/.cache/shmbroker (once; Maven's repository is ~/.m2), and Kafka
# Connect's with MirrorMaker 2 (scripts/harness/connect/pom.xml) beside them; and the archive of Kafka's classes
# the tests' JVMs map instead of loading them each (kafka_peer.make_class_archive: one broker's life, once).
kafka: test-venv sysdeps
	$(PY) -m scripts.harness.kafka_peer --fetch

# librdkafka's own test-runner, for its tests that need Kafka's tools (tests/test_librdkafka_suite.py): its source
# from the npm registry, built once into ~/.cache/shmbroker (scripts/harness/librdkafka_suite.py; minutes).
librdkafka: test-venv sysdeps
	$(PY) -m scripts.harness.librdkafka_suite --build

# Redis for scripts/bench_report.py's side-by-side runs (redis-server and redis-benchmark).
redis:
	@{ command -v redis-server >/dev/null 2>&1 && command -v redis-benchmark >/dev/null 2>&1; } || { $(APT_INSTALL) redis-server redis-tools; }

# The wheel users install: every package of the node, the compiled shm._ringops and workers.codecs._header for
# this Python, no tests or scripts. pip builds it in an isolated environment from the sources, as `pip install .`
# would; setuptools' build/ goes first, as it keeps files since moved or deleted and would put them in the wheel.
WHEEL_DIR ?= dist
wheel: venv
	rm -rf $(WHEEL_DIR) build
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir $(WHEEL_DIR) .
	@ls $(WHEEL_DIR)/shmbroker-*.whl

# The node as a systemd service (as root), installed from the wheel: a venv in $(PREFIX) made with
# $(SERVICE_PYTHON) (a Python the service user can run: not one under /root), the unit (its paths follow
# PREFIX), its user (sysusers.d), its directories (tmpfiles.d), the example config (kept if one is there), then
# `systemctl enable --now shmbroker` where systemd runs. ROOT installs under another root directory (an image, a
# test): users and directories are made there with systemd-sysusers/systemd-tmpfiles --root, and the unit is
# enabled with systemctl --root, not started.
PREFIX ?= /opt/shmbroker
ROOT ?=
SERVICE_PYTHON ?= $(shell command -v /usr/bin/python3.11 || command -v /usr/bin/python3 || echo $(PYTHON))
install-service: wheel
	@test "$$(id -u)" = 0 || { echo "make install-service: run as root"; exit 1; }
	install -d $(ROOT)$(PREFIX) $(ROOT)/usr/lib/sysusers.d $(ROOT)/usr/lib/tmpfiles.d $(ROOT)/etc/systemd/system \
		$(ROOT)/etc/shmbroker
	$(SERVICE_PYTHON) -m venv --clear $(ROOT)$(PREFIX)/.venv || { $(APT_INSTALL) python3-venv; \
		$(SERVICE_PYTHON) -m venv --clear $(ROOT)$(PREFIX)/.venv; }
	$(ROOT)$(PREFIX)/.venv/bin/pip install --quiet $(WHEEL_DIR)/shmbroker-*.whl
	install -m 0644 README.md $(ROOT)$(PREFIX)/README.md
	install -d $(ROOT)$(PREFIX)/docs && install -m 0644 docs/*.md $(ROOT)$(PREFIX)/docs/
	install -m 0644 systemd/shmbroker.sysusers $(ROOT)/usr/lib/sysusers.d/shmbroker.conf
	install -m 0644 systemd/shmbroker.tmpfiles $(ROOT)/usr/lib/tmpfiles.d/shmbroker.conf
	systemd-sysusers --root=$(ROOT)/ $(ROOT)/usr/lib/sysusers.d/shmbroker.conf
	systemd-tmpfiles --root=$(ROOT)/ --create $(ROOT)/usr/lib/tmpfiles.d/shmbroker.conf
	test -e $(ROOT)/etc/shmbroker/shmbroker.toml || install -m 0644 systemd/shmbroker.toml $(ROOT)/etc/shmbroker/shmbroker.toml
	sed 's#/opt/shmbroker#$(PREFIX)#g' systemd/shmbroker.service > $(ROOT)/etc/systemd/system/shmbroker.service
	@if [ -n "$(ROOT)" ]; then systemctl --root=$(ROOT)/ enable shmbroker; \
	elif [ -d /run/systemd/system ]; then systemctl daemon-reload && systemctl enable --now shmbroker; \
	else echo "shmbroker: systemd is not running here: the unit is installed, not started"; fi
	@echo "shmbroker: installed in $(ROOT)$(PREFIX); status: systemctl status shmbroker; stats: $(PREFIX)/.venv/bin/shmbroker stats --data-dir /var/lib/shmbroker/data"

uninstall-service:
	@test "$$(id -u)" = 0 || { echo "make uninstall-service: run as root"; exit 1; }
	-@if [ -n "$(ROOT)" ]; then systemctl --root=$(ROOT)/ disable shmbroker; \
	elif [ -d /run/systemd/system ]; then systemctl disable --now shmbroker; fi
	rm -f $(ROOT)/etc/systemd/system/shmbroker.service $(ROOT)/usr/lib/sysusers.d/shmbroker.conf \
		$(ROOT)/usr/lib/tmpfiles.d/shmbroker.conf
	-@[ -n "$(ROOT)" ] || [ ! -d /run/systemd/system ] || systemctl daemon-reload
	@echo "shmbroker: unit removed; data in /var/lib/shmbroker, config in /etc/shmbroker and $(PREFIX) are kept"

# The node on 127.0.0.1:9092 with its data in ./data (LISTEN=, DATA_DIR= change them), until Ctrl-C (a clean
# stop). The recipe execs the node, so it is make's own child: Ctrl-C reaches it with the terminal's process
# group, and make passes a SIGTERM on to it.
LISTEN ?= 127.0.0.1:9092
DATA_DIR ?= ./data
run: venv
	exec $(VENV)/bin/shmbroker serve --listen $(LISTEN) --data-dir $(DATA_DIR)

# Two parts, both always run: the tests marked `serial` (they time things, or use both cores) alone, after the
# others ran TEST_JOBS at a time (pytest-xdist; a file's tests stay together in one worker, the longest files
# first: tests/conftest.py).
# Four on two cores: the tests wait on their nodes and clients more than they compute (a full run at 2 used about
# one core; at 3 the first part took 12:15 with a quarter of the CPU idle, at 4 10:51 with 1-8% idle).
TEST_JOBS ?= 4
# The edit-test loop: the tests that start no node, JVM or Spark session, CHECK_JOBS at a time. They compute
# rather than wait, so three on two cores do best (1,259 tests: 77 s at three, 86 s at four).
CHECK_JOBS ?= 3
check: test-venv
	$(PY) -m pytest -q tests -m "not node and not jvm and not serial" -n $(CHECK_JOBS) --dist loadgroup --no-loadscope-reorder

test: test-venv sysdeps redis kafka librdkafka
	@status=0; \
	$(PY) -m pytest -q tests -m "not serial" -n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder || status=$$?; \
	$(PY) -m pytest -q tests -m serial || status=$$?; \
	exit $$status

# The reference pages written from the code: docs/configuration.md (node/config.py), docs/metrics.md (the stats
# segment and the Prometheus series) and docs/cli.md (`shmbroker --help`); tests/test_docs.py fails when one is stale.
docs: venv
	$(PY) -m shmbroker.node.tools.docgen

clean:
	rm -rf $(VENV) build dist *.egg-info shm/*.so
