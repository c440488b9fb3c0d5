PY ?= python3

.PHONY: bootstrap install images proto proto-check lint typecheck gates check test test-unit bench serve

install:            ## Python package with the dev extra (the same install as bootstrap's)
	$(PY) -m pip install -q -e '.[dev]'

images:             ## build the sandbox image(s) offline; quick when nothing changed
	bash sandbox_images/build.sh

proto:              ## regenerate dispatcher/v1 from proto/
	bash scripts/gen_proto.sh

proto-check:
	bash scripts/gen_proto.sh --check

lint:
	$(PY) -m ruff check dispatcher tests bench
	$(PY) -m ruff format --check dispatcher tests bench

typecheck:
	$(PY) -m mypy --strict

gates:              ## lint, format, mypy --strict, proto check: what make test runs before pytest
	PY=$(PY) bash scripts/gates.sh

check: gates test-unit

test:               ## the whole suite: installs what it needs (Docker, image), the gates, then pytest
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
