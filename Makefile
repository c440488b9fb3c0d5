PY ?= python3

.PHONY: install images proto proto-check lint typecheck check test test-unit bench serve

install:            ## Python package with dev extras
	$(PY) -m pip install -q -e '.[dev]'

images:             ## build the sandbox image(s) offline; quick when nothing changed
	bash sandbox_images/build.sh

proto:              ## regenerate dispatcher/v1 from proto/
	bash scripts/gen_proto.sh

proto-check:
	bash scripts/gen_proto.sh --check

lint:
	ruff check dispatcher tests bench
	ruff format --check dispatcher tests bench

typecheck:
	mypy

check: lint typecheck proto-check test

test:               ## the whole suite (docker tests need a daemon + `make images`)
	$(PY) -m pytest -q

test-unit:
	$(PY) -m pytest -q tests/unit

bench:
	$(PY) -m bench
