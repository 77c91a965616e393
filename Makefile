# kvscope: `make demo` sets up and runs the demo; `make test` sets up and runs the tests.
.PHONY: setup demo test lint format

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/kvscope demo

test: setup
	./scripts/test.sh

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
