# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export RATCHET_HOME ?= $(CURDIR)/.ratchet
export MLFLOW_DISABLE_TELEMETRY := true
export DAGSTER_DISABLE_TELEMETRY := true
export PYTHONHASHSEED := 0

.PHONY: install sysdeps docker-engine demo test test-all bench ui validate clean

# System packages: bubblewrap isolates sandbox episodes (installed once, needs root/apt).
# docker.io + debootstrap give the Docker runtime an engine and a base image built offline;
# they are optional: where they cannot be installed the Docker tests skip and say why.
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "bubblewrap is missing: run 'sudo apt-get install bubblewrap'" >&2; exit 1; fi; }
	@{ command -v dockerd && command -v debootstrap; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null; } \
	    || echo "warning: could not install docker.io/debootstrap: the Docker sandbox tests will skip" >&2; \
	  else echo "note: docker.io/debootstrap are missing ('sudo apt-get install docker.io debootstrap'): the Docker sandbox tests will skip" >&2; fi; }

# A Docker engine (dockerd started, no bridge network, when none answers) and the sandbox base
# image (debootstrap + docker import, built once per machine, ~1 min). Never fails the build:
# where Docker cannot run it prints why and the Docker tests skip with that reason.
docker-engine: $(VENV)/.installed
	-@$(PY) -m sandboxes.docker_engine --ensure

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e .
	touch $@

install: sysdeps $(VENV)/.installed

demo: install
	$(VENV)/bin/ratchet demo

test: install docker-engine
	$(VENV)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider

test-all: install
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

validate: install
	DAGSTER_HOME=$(RATCHET_HOME)/dagster $(VENV)/bin/dagster definitions validate -w workspace.yaml

bench: install
	for b in bench/*.py; do $(PY) $$b || exit 1; done

ui: install
	$(VENV)/bin/ratchet ui

clean:
	rm -rf $(RATCHET_HOME)
