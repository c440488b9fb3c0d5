PY ?= python3

.PHONY: bootstrap install images proto proto-check lint typecheck check test test-unit bench serve

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

check: lint typecheck proto-check test-unit

test:               ## the whole suite: installs what it needs (Docker engine, image), then pytest
	bash scripts/test.sh

bootstrap:          ## install the package, start Docker if none answers, build the sandbox image
	bash scripts/bootstrap.sh

test-unit:
	$(PY) -m pytest -q tests/unit

bench:
	$(PY) -m bench

serve:              ## bootstrap a new machine, then serve with the embedded defaults (127.0.0.1:50051)
	bash scripts/bootstrap.sh
	dispatcher serve $(ARGS)
