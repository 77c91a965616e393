# kvscope: `make demo` sets up and runs the demo; `make test` sets up and runs the tests.
.PHONY: setup demo test lint format bench

setup:
	./scripts/setup.sh

demo: setup
	.venv/bin/kvscope demo

test: setup
	./scripts/test.sh

# Every benchmark at full size (the long soak too), then docs/bench/README.md and its plots.
bench: setup
	.venv/bin/python -m kvscope.bench.report

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	./scripts/typecheck.sh

format:
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .
