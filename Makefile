# Two commands on a fresh machine: `make demo` and `make test`. Each installs what it needs into .venv first.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat requirements.txt requirements-dev.txt | sha256sum | cut -c1-12)

# A project-local Airflow: its own home and SQLite DB, our dags/ and plugins/, no examples.
AIRFLOW_ENV := PATH="$(CURDIR)/$(VENV)/bin:$$PATH" AIRFLOW_HOME="$(CURDIR)/.airflow" \
	AIRFLOW__CORE__DAGS_FOLDER="$(CURDIR)/dags" AIRFLOW__CORE__PLUGINS_FOLDER="$(CURDIR)/plugins" \
	AIRFLOW__CORE__LOAD_EXAMPLES=False AIRFLOW__CORE__PARALLELISM=4 PYTHONPATH="$(CURDIR)/plugins:$(CURDIR)"

.PHONY: install install-floor chromium kubectl test test-floor lint demo demo-plan plan docs bench-e2e bench-slots bench-recovery clean

install: $(STAMP)

# Python writes the bytecode of what it imports, once, into the venv and the repo's __pycache__ (gitignored), whatever
# the machine says: with PYTHONDONTWRITEBYTECODE set (this machine) and nothing compiled, every process of the tests
# compiled what it imported again, and they ran 1,861 s instead of 1,164 s. Compiling only what is imported, the first
# time, replaces compiling every file of the venv at install (uv's --compile-bytecode: 68 s instead of 27-40 s).
unexport PYTHONDONTWRITEBYTECODE

# uv installs the same pins as pip (the same `pip freeze`, compared) in 27-40 s instead of 112 s for .venv. uv reads no
# pip config, so it gets pip's find-links (this machine's CPU PyTorch wheel lies there); where uv cannot be had or
# fails, pip installs. $(1): the venv's python, $(2): pip's install arguments.
UV_VERSION := 0.13.9
define venv_install
	$(1) -m pip install --quiet --upgrade pip uv==$(UV_VERSION)
	links=$$($(1) -m pip config list 2>/dev/null | sed -n "s/^.*\.find-links='\(.*\)'$$/\1/p" | sort -u); \
	$(dir $(1))uv pip install --quiet --python $(1) $$(for l in $$links; do echo --find-links $$l; done) $(2) \
		|| $(1) -m pip install --quiet $(2)
endef

$(STAMP): requirements.txt requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(call venv_install,$(PY),-r requirements-dev.txt)
	@rm -f $(VENV)/.installed-* && touch $@

# The browser tests' Chromium: Debian's package (Playwright's own download cannot reach its host from here). Only when
# it is missing; apt-get needs root, which CI and the developers' machines are.
chromium:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# The operator tests' kubectl (tests/gcp/test_kubectl.py): the machine's own, else the distribution's package.
kubectl:
	@command -v kubectl > /dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubectl) \
		|| DEBIAN_FRONTEND=noninteractive apt-get install -y -qq kubernetes-client

# One worker more than the machine has cores: most tests wait (on Airflow, the sandbox, Ray) rather than compute, and
# the third worker fills those waits (on this 2-core machine the main tests took 1,100 s with 3 workers, 1,240 s with
# 2, measured 2026-12-05). A module's tests stay on one worker: they share its sandbox and Ray head. Files go out in collection order, which
# tests/conftest.py starts with the longest (LONGEST_FIRST), so no worker ends alone on a whole-DAG file. Their temp
# dirs (the Airflow test DBs, the sandboxes' state, the Ray heads' sessions) go to tmpfs where there is one: SQLite
# and the sandbox fsync every commit, which on this machine's disk costs about 8 ms each (0.1 ms on tmpfs).
FAST_TMP := $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo /tmp)
# Then the same again on the floor (test-floor), after them. Beside them, even at nice 19, the floor's install and
# tests slowed the whole runs' Ray starts enough that one timed out (CI on 2026-12-05). SUBMAKE, not $(MAKE): `make -n
# test` must not run it.
SUBMAKE = $(MAKE) --no-print-directory
WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
test: $(STAMP) chromium kubectl
	TMPDIR=$(FAST_TMP) $(PY) -m pytest -n $(WORKERS) --dist loadfile --no-loadscope-reorder --durations=10
	@$(SUBMAKE) test-floor

# The floor (requirements-floor.txt): the oldest Airflow the package supports, in its own venv, with the rest of
# requirements.txt and the test pins of requirements-dev.txt. Its tests are the ones that run no whole DAG: the
# DAG-integrity and the unit tests, but for those of remote/ (the checkpoint validator shipped to the cluster, which
# imports no Airflow: tests/unit/test_layers.py holds it to that), so the floor needs no PyTorch.
FLOOR_VENV := .venv-floor
FLOOR_PY := $(FLOOR_VENV)/bin/python
FLOOR_DEV_PINS := pytest pytest-xdist cryptography psutil
FLOOR_STAMP := $(FLOOR_VENV)/.installed-$(shell (cat requirements.txt requirements-dev.txt requirements-floor.txt; \
	echo $(FLOOR_DEV_PINS)) | sha256sum | cut -c1-12)
FLOOR_TESTS := tests/unit tests/dags/test_dag_integrity.py tests/dags/test_parse_imports.py \
	--ignore=tests/unit/test_checkpoints.py --ignore=tests/unit/test_checkpoints_v2.py

$(FLOOR_STAMP): requirements.txt requirements-dev.txt requirements-floor.txt
	@test -x $(FLOOR_PY) || $(PYTHON) -m venv $(FLOOR_VENV)
	@sed -e '/^apache-airflow==/d' requirements.txt > $(FLOOR_VENV)/pins.txt
	@for p in $(FLOOR_DEV_PINS); do grep -E "^$$p==" requirements-dev.txt; done >> $(FLOOR_VENV)/pins.txt
	$(call venv_install,$(FLOOR_PY),-r requirements-floor.txt -r $(FLOOR_VENV)/pins.txt)
	@rm -f $(FLOOR_VENV)/.installed-* && touch $@

install-floor: $(FLOOR_STAMP)

test-floor: $(FLOOR_STAMP)
	TMPDIR=$(FAST_TMP) $(FLOOR_PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder $(FLOOR_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The main job on the local sandbox: the tutorial's run in apply mode through the real DAG (`airflow dags test`),
# against a local GCP sandbox started for it: every resource is created, then deleted again.
demo: $(STAMP)
	@mkdir -p .airflow
	@$(AIRFLOW_ENV) airflow db migrate > .airflow/migrate.log 2>&1 || (cat .airflow/migrate.log; exit 1)
	@$(AIRFLOW_ENV) $(PY) -m sandbox.demo --sandbox --conf include/conf/local.json

# The demo run's stage-by-stage makespan and its ratio to the critical-path bound.
bench-e2e: $(STAMP)
	@mkdir -p .airflow
	@$(AIRFLOW_ENV) airflow db migrate > .airflow/migrate.log 2>&1 || (cat .airflow/migrate.log; exit 1)
	@$(AIRFLOW_ENV) $(PY) bench/e2e.py

# One lost worker node mid-training: steps lost per save period (target <= 1.0), and the time from the loss to the
# first new step per modelled replacement time (target <= 1.2).
bench-recovery: $(STAMP)
	@mkdir -p .airflow
	@$(AIRFLOW_ENV) airflow db migrate > .airflow/migrate.log 2>&1 || (cat .airflow/migrate.log; exit 1)
	@$(AIRFLOW_ENV) $(PY) bench/recovery.py

# Worker-slot seconds spent while waiting on a real scheduler and triggerer (target <= 0.02).
bench-slots: $(STAMP)
	@$(PY) bench/worker_slots.py

# The tutorial's run in plan mode through the real DAG: validate -> plan, the plan printed at the end.
demo-plan: $(STAMP)
	@mkdir -p .airflow
	@$(AIRFLOW_ENV) airflow db migrate > .airflow/migrate.log 2>&1 || (cat .airflow/migrate.log; exit 1)
	@$(AIRFLOW_ENV) $(PY) -m sandbox.demo --conf include/conf/tutorial.json

# The same plan without Airflow, from the package CLI.
# Judged as by the tutorial's deployment: its Google connection names the tutorial's project (the default bound).
plan: $(STAMP)
	@AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT='{"conn_type": "google_cloud_platform", "extra": {"project": "nemo-rl-demo"}}' \
		PYTHONPATH=plugins $(PY) -m nemo_rl_gke plan --conf include/conf/tutorial.json

# The generated tables in docs/ (preflight rules, conf parameters, deployment settings); tests fail when they are stale.
docs: $(STAMP)
	@PYTHONPATH=plugins $(PY) -m nemo_rl_gke docs

clean:
	rm -rf .airflow .pytest_cache .ruff_cache
