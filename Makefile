# Every target sets up what it needs, so `make run` and `make test` work alone on a fresh clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: run test bench lint install clean system-deps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(PY) -m broker --config config.toml

# amqp-tools (librabbitmq's CLI) is a system package: installed through apt when we can;
# otherwise its test module reports that it did not run and why.
system-deps:
	@command -v amqp-publish >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq amqp-tools) >/dev/null 2>&1 \
	      || echo "note: could not install amqp-tools with apt-get"; \
	  else echo "note: amqp-tools not installed (needs root and apt-get)"; fi; }

test: $(STAMP) system-deps
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/codec.py
	$(PY) bench/matching.py --quick

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
