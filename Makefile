# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Each bootstraps .venv with `python3 -m venv` and pip, from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= config.toml

.PHONY: run test install install-test unit integration bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Stamp files so a second `make` does not reinstall unless the packaging or the one C source
# (built in place by the editable install: setup.py) changed.
BUILD_INPUTS := pyproject.toml setup.py appliance/protocol/_recwalk.c

$(VENV)/.installed: $(BUILD_INPUTS) | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(BUILD_INPUTS) | $(BIN)/python fuse3 chromium prometheus
	$(BIN)/python -m pip install --quiet -e '.[test,spark]'
	touch $(VENV)/.installed $@

# The power-cut tests mount a FUSE file system of their own (tests/integration/lazyfs.py):
# Debian's fuse3 gives fusermount3 and libfuse3, which mfusepy loads. Installed when missing and
# root (CI and the developers' machines); otherwise those tests fail naming it.
.PHONY: fuse3
fuse3:
	@command -v fusermount3 >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	    && (apt-get install -y -qq fuse3 >/dev/null 2>&1 \
	        || (apt-get update -qq && apt-get install -y -qq fuse3 >/dev/null)); } \
	    || echo "fuse3 not installed: the power-cut tests will fail naming it"

# The console's browser tests (tests/integration/test_console.py) drive Debian's chromium through
# Playwright (which cannot download a browser of its own here): installed the same way as fuse3.
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	    && (apt-get install -y -qq chromium >/dev/null 2>&1 \
	        || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)); } \
	    || echo "chromium not installed: the console's browser tests will fail naming it"

# tests/integration/test_prometheus.py scrapes the appliance with Debian's prometheus (and checks
# the exposition with its promtool), starting its own with its own config and data dir: the
# package's service is kept from starting (a policy-rc.d saying 101 while it installs, unless
# the machine has one already) and disabled, so nothing else listens on its port 9090.
.PHONY: prometheus
prometheus:
	@command -v promtool >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	    && { own=; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d \
	            && chmod 755 /usr/sbin/policy-rc.d && own=1; }; \
	        (apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
	            || (apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null)); \
	        rc=$$?; [ -z "$$own" ] || rm -f /usr/sbin/policy-rc.d; \
	        command -v systemctl >/dev/null && systemctl disable --now prometheus >/dev/null 2>&1; \
	        [ $$rc = 0 ]; }; } \
	    || echo "prometheus not installed: tests/integration/test_prometheus.py will fail naming it"

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

run: install
	$(BIN)/appliance run --config $(CONFIG)

# Two pytest processes: most of a test's time is an appliance starting, a client waiting or a
# JVM starting, so two of them share a 2-core machine well (32 min alone, about 20 in two).
# Each test module runs whole in one process (its module-scoped appliance and Spark session), the
# modules that start Spark's JVMs one after the other, the longest first (tests/conftest.py).
TEST_WORKERS ?= 2
# What to run: the whole suite unless told (make test TESTS=tests/unit/test_readme.py).
TESTS ?= tests

test: install-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(TESTS)

unit: install-test
	$(BIN)/python -m pytest -q tests/unit

integration: install-test
	$(BIN)/python -m pytest -q tests/integration

bench: install-test
	$(BIN)/python loadtests/bench_produce.py

clean:
	rm -rf $(VENV) build *.egg-info appliance/protocol/_recwalk.*.so
