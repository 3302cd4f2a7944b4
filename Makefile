# Two entry points: `make run` and `make test`. Everything they need is set up here,
# so a fresh Debian machine with only Python 3.11 and make is enough.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv sysdeps clean bench

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "need $(PYTHON)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# System packages the tests use, from the distribution, only when missing.
sysdeps:
	@missing=""; \
	command -v kcat >/dev/null 2>&1 || missing="$$missing kcat"; \
	if [ -n "$$missing" ]; then \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

# The node on 127.0.0.1:9092 with its data in ./data, until Ctrl-C (a clean stop).
run: venv
	$(VENV)/bin/shmbroker serve --listen 127.0.0.1:9092 --data-dir ./data

test: venv sysdeps
	$(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
