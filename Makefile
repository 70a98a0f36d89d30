# Two entry points (see README): `make run` and `make test`. Everything a test needs is set up here.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Re-install only when the dependency list changes; heavy wheels stay cached in .venv.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: run test install venv postgres chromium clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

run: install
	$(VENV)/bin/tilesearch db upgrade
	$(VENV)/bin/tilesearch serve --host 127.0.0.1 --port 8000

# PostgreSQL for the store/API tests: use a running server, else start or install one.
postgres:
	@scripts/ensure-postgres.sh

# Debian's Chromium for the dashboard's browser tests (Playwright drives it; no browser download).
chromium:
	@scripts/ensure-chromium.sh

test: install postgres chromium
	$(PY) -m pytest

clean:
	rm -rf $(VENV) .pytest_cache
