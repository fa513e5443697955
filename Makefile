# The habits of .ci/run, one word each. `make venv` once; then `make test-fast` while you work,
# `make lint test` before you push.
VENV ?= .venv
BIN := $(VENV)/bin
LINTED := app clients/python tests bench alembic
TYPED := app clients/python/src alembic

.PHONY: venv test test-fast lint format reference openapi web-client statements bench ci

venv:  ## the README's install, editable, with the test tools
	python3 -m venv $(VENV) && $(BIN)/pip install -q -e ./clients/python -e '.[test]'

test:  ## every test: real PostgreSQL (embedded, or $$DATABASE_URL), processes, Chromium
	$(BIN)/pytest

test-fast:  ## the unit tests: in-process, no PostgreSQL, no servers (about half a minute)
	$(BIN)/pytest -m unit -q

lint:  ## what CI checks: ruff, ruff format, mypy
	$(BIN)/ruff check $(LINTED)
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/mypy $(TYPED)

format:  ## fix what ruff can
	$(BIN)/ruff check --fix $(LINTED)
	$(BIN)/ruff format $(LINTED)

reference:  ## regenerate docs/reference.md from the code
	$(BIN)/python -m app.reference --write

openapi:  ## regenerate docs/openapi.json from the app, and the TypeScript client's types from it
	$(BIN)/python -m app.api.openapi --write
	npm run --silent generate --prefix clients/typescript

web-client:  ## rebundle app/web/ferryman-client.js, the workbench's copy of @ferryman/client
	npm run --silent web --prefix clients/typescript

statements:  ## rewrite app/store/statements.sql, the readable copy of the store's statements
	$(BIN)/python -m app.store.statements --write

ci:  ## what CI runs, from a fresh venv: the README's test command, lint, the suite on PostgreSQL 15
	bash .ci/run

bench:  ## Ferryman beside its peers (docs/performance.md); needs `pip install -e '.[bench]'`
	$(BIN)/python -m bench.compare --units 1000 --workers 2 --rounds 2
