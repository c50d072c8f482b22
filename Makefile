# Every target sets up what it needs, so `make run` and `make test` work alone on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
RUN_STAMP  := $(VENV)/.installed-run
DEV_STAMP  := $(VENV)/.installed-dev

.PHONY: run test check hunt bench lint typecheck format install clean system-deps node-deps tools cluster cluster-stop

# When make started: `make test` and `make check` end by printing how long they took,
# set-up included.
START := $(shell date +%s)
# Runs the commands given as one shell list, then prints "make TARGET: passed|FAILED in M min
# S s" and exits with their status.
define timed
	@status=0; $(1) || status=$$?; t=$$(( $$(date +%s) - $(START) )); \
	if [ $$status = 0 ]; then word=passed; else word=FAILED; fi; \
	echo "make $@: $$word in $$((t / 60)) min $$((t % 60)) s"; exit $$status
endef

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# The modules setup.py compiles (roarmq/__init__.py's COMPILED: each has a .pxd that types
# it), with those .pxd files: a change to either rebuilds.
PXD_FILES := $(wildcard protocol/*.pxd broker/*/*.pxd)
COMPILED_SOURCES := $(PXD_FILES) $(PXD_FILES:.pxd=.py)

# The broker alone: uvloop, pyroaring, aiohttp, prometheus-client.
$(RUN_STAMP): pyproject.toml setup.py $(COMPILED_SOURCES) | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e .
	touch $@

# Tests, benchmarks and the PySpark pipeline on top.
$(DEV_STAMP): pyproject.toml setup.py $(COMPILED_SOURCES) | $(VENV)/bin/python
	$(PY) -m pip install --quiet -e '.[dev,pipeline]'
	touch $@ $(RUN_STAMP)

install: $(DEV_STAMP)

# Extra options after the config: make run ARGS="--port 5673 --log-level info"
ARGS ?=
run: $(RUN_STAMP)
	$(PY) -m roarmq --config config.toml $(ARGS)

# A local cluster to try (docs/cluster.md): `roarmq cluster-demo` (broker/cli/cluster_demo.py)
# starts etcd on 127.0.0.1:2479 and three nodes n1..n3 (AMQP 5681..5683, management
# 15681..15683), everything under ./cluster-demo/; `make cluster-stop` stops exactly those PIDs.
cluster: $(RUN_STAMP) .tools/etcd
	$(VENV)/bin/roarmq cluster-demo --make

cluster-stop:
	$(VENV)/bin/roarmq cluster-demo stop

# System packages the tests use: amqp-tools (librabbitmq's CLI), a Java runtime for Spark,
# the openssl CLI (tests/amqp/test_tls.py runs docs/security.md's certificate recipe),
# headless Chromium with its driver (tests/ui/test_web_ui.py drives the web UI), fuse3
# (libfuse3 and fusermount3, for tests/support/powerloss.py's power-loss filesystem), and
# erlang-base (erl: tests/management/test_api_parity.py checks our phash2 against OTP's).
# Installed through apt when we can; otherwise the tests that need them say why they did
# not run.
APT_PACKAGES := $(if $(shell command -v amqp-publish),,amqp-tools) $(if $(shell command -v java),,openjdk-17-jre-headless) $(if $(shell command -v openssl),,openssl) $(if $(shell command -v chromedriver),,chromium chromium-driver) $(if $(shell command -v strace),,strace) $(if $(shell command -v fusermount3),,fuse3) $(if $(shell command -v erl),,erlang-base)
# nftables and iproute2 (nft, ip) for tests/support/netns.py: network namespaces and kernel
# partitions for tests/cluster/test_jepsen.py and bench/jepsen.py.
APT_PACKAGES += $(if $(shell command -v nft),,nftables) $(if $(shell command -v ip),,iproute2)
# RabbitMQ (with its stream plugin) for the tests that hold RoarMQ's answers against it.
APT_PACKAGES += $(if $(wildcard /usr/sbin/rabbitmq-server),,rabbitmq-server)

system-deps:
	@if [ -n "$(strip $(APT_PACKAGES))" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES)) >/dev/null 2>&1 \
	      || echo "note: could not install $(APT_PACKAGES) with apt-get"; \
	  else echo "note: $(APT_PACKAGES) not installed (needs root and apt-get)"; fi; fi

# amqplib for the Node checks of tests/clients/test_dropin.py, when npm is present (the
# test says why it did not run otherwise).
node-deps:
	@if command -v npm >/dev/null 2>&1; then \
	  (cd tests/node && npm install --no-audit --no-fund --silent >/dev/null 2>&1) \
	    || echo "note: npm install in tests/node failed; the amqplib checks will say so"; \
	else echo "note: npm not installed; the amqplib checks will say so"; fi

# RabbitMQ's own CLI, rabbitmqadmin (one Python file), for tests/management/test_rabbitmqadmin.py:
# taken out of Debian's rabbitmq-server package with dpkg-deb, RabbitMQ itself not installed.
# Prometheus (Debian's 2.42) for tests/management/test_grafana_dashboards.py, likewise taken out
# of its package: the binary alone, no service, no user, nothing else installed.
# etcd (Debian's etcd-server, 3.4) for tests/cluster/, likewise: the etcd binary alone.
tools: .tools/rabbitmqadmin .tools/prometheus .tools/etcd

.tools/rabbitmqadmin:
	@mkdir -p .tools
	@if command -v rabbitmqadmin >/dev/null 2>&1; then cp "$$(command -v rabbitmqadmin)" $@; \
	elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  (cd .tools && rm -rf deb && mkdir deb && cd deb \
	    && (apt-get download rabbitmq-server >/dev/null 2>&1 \
	        || (apt-get update -qq >/dev/null 2>&1 && apt-get download rabbitmq-server >/dev/null 2>&1)) \
	    && dpkg-deb -x rabbitmq-server_*.deb x && cp x/usr/bin/rabbitmqadmin ../rabbitmqadmin) \
	    || echo "note: could not extract rabbitmqadmin; its test will say so"; \
	  rm -rf .tools/deb; \
	else echo "note: no apt-get; tests/management/test_rabbitmqadmin.py will say so"; fi

.tools/prometheus:
	@mkdir -p .tools
	@if command -v prometheus >/dev/null 2>&1; then cp "$$(command -v prometheus)" $@; \
	elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  (cd .tools && rm -rf prom-deb && mkdir prom-deb && cd prom-deb \
	    && (apt-get download prometheus >/dev/null 2>&1 \
	        || (apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1)) \
	    && dpkg-deb -x prometheus_*.deb x && cp x/usr/bin/prometheus ../prometheus) \
	    || echo "note: could not extract prometheus; tests/management/test_grafana_dashboards.py will say so"; \
	  rm -rf .tools/prom-deb; \
	else echo "note: no apt-get; tests/management/test_grafana_dashboards.py will say so"; fi

.tools/etcd:
	@mkdir -p .tools
	@if command -v etcd >/dev/null 2>&1; then cp "$$(command -v etcd)" $@; \
	elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1; then \
	  (cd .tools && rm -rf etcd-deb && mkdir etcd-deb && cd etcd-deb \
	    && (apt-get download etcd-server >/dev/null 2>&1 \
	        || (apt-get update -qq >/dev/null 2>&1 && apt-get download etcd-server >/dev/null 2>&1)) \
	    && dpkg-deb -x etcd-server_*.deb x && cp x/usr/bin/etcd ../etcd) \
	    || echo "note: could not extract etcd; tests/cluster/ will say so"; \
	  rm -rf .tools/etcd-deb; \
	else echo "note: no apt-get; tests/cluster/ will say so"; fi

# The whole suite with the message path compiled (setup.py; required when a C compiler is
# here), then the tests of the compiled packages again on the Python source
# (ROARMQ_NO_EXTENSIONS=1): those modules keep one source, which must behave the same
# uncompiled. PURE_PYTHON_TESTS are the packages setup.py compiles from (protocol/'s frames,
# routing/, core/'s message, queue and exchange, amqp/'s connection and channel) and the real
# clients end to end, less their `slow` tests; every other package runs the same Python in
# both builds and its tests once. The slow ones (Spark, a browser, kill -9 and disk-fault
# rounds, load until the broker pushes back) run once, compiled: the build a release runs.
PURE_PYTHON_TESTS ?= tests/protocol tests/routing tests/core tests/amqp tests/clients
EXPECT_COMPILED := $(if $(shell command -v cc),ROARMQ_EXPECT_COMPILED=1)
# Three pytest-xdist workers on CI's two cores: most tests wait (on sockets, processes,
# timers) more than they compute (with two workers the compiled pass kept the cores 56%
# busy, 10 min 30 s; with three 70%, 8 min 35 s); tests that share an expensive fixture are
# one xdist_group (--dist loadgroup). Every test is written to pass on a loaded machine,
# which this is. `make test WORKERS=` runs them one at a time.
WORKERS ?= -n 3 --dist loadgroup
# What `make test` provides, the absence of which is then our failure, not a skip
# (tests/machine.py): where apt-get and dpkg-deb are, `make tools` extracts etcd, prometheus
# and rabbitmqadmin; as root with apt-get, `system-deps` installs amqp-tools, Java and
# chromium; with npm, `node-deps` installs amqplib; as root where /dev/fuse exists, FUSE
# mounts (tests/support/powerloss.py).
EXPECT_TOOLS := $(if $(and $(shell command -v apt-get),$(shell command -v dpkg-deb)),ROARMQ_EXPECT_TOOLS=1)
EXPECT_PACKAGES := $(if $(and $(filter 0,$(shell id -u)),$(shell command -v apt-get)),ROARMQ_EXPECT_PACKAGES=1)
EXPECT_NODE := $(if $(shell command -v npm),ROARMQ_EXPECT_NODE=1)
EXPECT_FUSE := $(if $(and $(filter 0,$(shell id -u)),$(wildcard /dev/fuse)),ROARMQ_EXPECT_FUSE=1)
EXPECT_ROOT := $(if $(filter 0,$(shell id -u)),ROARMQ_EXPECT_ROOT=1)

test: $(DEV_STAMP) system-deps node-deps tools
	$(call timed,$(EXPECT_COMPILED) $(EXPECT_TOOLS) $(EXPECT_PACKAGES) $(EXPECT_NODE) $(EXPECT_FUSE) $(EXPECT_ROOT) $(PY) -m pytest $(WORKERS) \
	  && ROARMQ_NO_EXTENSIONS=1 $(PY) -m pytest $(WORKERS) -q -m "not slow" $(PURE_PYTHON_TESTS))

# The edit-test loop: every test not marked `slow` (pyproject.toml says what that covers), no
# system packages or tools installed (tests that need one say why they did not run); its tests
# took 167 s on 2 cores at load 7, where the full suite took 601 s. `make test` is the gate.
check: $(DEV_STAMP)
	$(call timed,$(EXPECT_COMPILED) $(PY) -m pytest $(WORKERS) -q -m "not slow")

# The flake hunt: the slow tests of the broker, its store and its cluster HUNT_PASSES times in
# a row, each pass beside one busy loop per core (the load CI may be under), stopping at the
# first failure, whose logs stay under HUNT_TMP (each pass starts it afresh). A test that
# fails here is a bug to fix at its cause. The slow tests elsewhere (the parity tests against
# RabbitMQ in tests/stream_protocol, the Docker steps, the routing properties) can be
# hunted too: HUNT_PATHS="tests/stream_protocol ...".
HUNT_PASSES ?= 20
HUNT_TMP ?= /tmp/roarmq-hunt
HUNT_PATHS ?= tests/store tests/cluster tests/replog tests/amqp tests/core tests/broker
hunt: $(DEV_STAMP) system-deps node-deps tools
	$(call timed,(burners=""; for cpu in $$(seq 0 $$(( $$(nproc) - 1 ))); do \
	    taskset -c $$cpu sh -c 'while :; do :; done' & burners="$$burners $$!"; done; \
	  trap 'kill $$burners' EXIT; \
	  for pass in $$(seq 1 $(HUNT_PASSES)); do echo "make hunt: pass $$pass of $(HUNT_PASSES)"; \
	    $(EXPECT_COMPILED) $(EXPECT_TOOLS) $(EXPECT_PACKAGES) $(EXPECT_NODE) $(EXPECT_FUSE) $(EXPECT_ROOT) \
	      $(PY) -m pytest $(WORKERS) -q -m slow --basetemp=$(HUNT_TMP) $(HUNT_PATHS) || exit 1; done))

# Quick versions of every benchmark (each prints a table and writes JSON to bench/results/).
bench: $(DEV_STAMP)
	$(PY) bench/codec.py --quick
	$(PY) bench/matching.py --quick
	$(PY) bench/hotpath.py
	$(PY) bench/throughput.py --quick
	$(PY) bench/steady.py --broker roarmq --repeat 1 --warmup 1 --window 2
	$(PY) bench/persistence.py --quick
	$(PY) bench/pipeline.py --quick
	$(PY) bench/overload.py --quick
	$(PY) bench/memory.py --messages 200000

lint: typecheck
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# mypy over the packages pyproject.toml's [tool.mypy] names, through .typecheck/: links
# that put each folder at its import name (broker/ is roarmq.broker), as installed.
typecheck: $(DEV_STAMP)
	@mkdir -p .typecheck/roarmq
	@for d in broker protocol pipeline; do ln -sfn ../../$$d .typecheck/roarmq/$$d; done
	@ln -sfn ../../roarmq/__init__.py .typecheck/roarmq/__init__.py
	$(PY) -m mypy

format: $(DEV_STAMP)
	$(PY) -m ruff format .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis tests/node/node_modules .tools
