# The two commands of README.md, and what CI runs (.ci/run).
.PHONY: serve test ci install install-test

serve: install
	.venv/bin/quickdraft serve

test: install-test
	.venv/bin/python -m pytest -q -ra

# The tests, then the latency gates (docs/benchmarks.md); each exits non-zero on failure.
ci: test
	.venv/bin/python -m quickdraft.bench.micro
	.venv/bin/python -m quickdraft.bench.gate --no-progress

install:
	scripts/install.sh

install-test:
	scripts/install.sh test
