# The two commands of README.md, and what CI runs (.ci/run).
.PHONY: serve test ci install install-test vscode

serve: install
	.venv/bin/quickdraft serve

test: install-test
	.venv/bin/python -m pytest -q -ra

# The tests, the VS Code extension's build, then the latency gates (docs/benchmarks.md);
# each exits non-zero on failure.
ci: test vscode
	.venv/bin/python -m quickdraft.bench.micro
	.venv/bin/python -m quickdraft.bench.gate --no-progress

# editors/vscode compiles with its locked dependencies (npm registry; the extension host cannot run here).
vscode:
	cd editors/vscode && npm ci --no-audit --no-fund && npm run build

install:
	scripts/install.sh

install-test:
	scripts/install.sh test
