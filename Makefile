# The two commands of README.md, and what CI runs (.ci/run).
.PHONY: serve test ci install install-test vscode

serve: install
	.venv/bin/quickdraft serve

test: install-test
	.venv/bin/python -m pytest -q -ra

# The VS Code extension's build (its tests run the compiled extension), the tests, the latency gates (docs/benchmarks.md), then a
# two-minute soak (RELIABILITY.md: 16 streams, no request lost); each exits non-zero on failure.
ci: vscode test
	.venv/bin/python -m quickdraft.bench.micro
	.venv/bin/python -m quickdraft.bench.gate --no-progress
	.venv/bin/python -m quickdraft.bench.soak --concurrency 16 --seconds 120 --warmup-seconds 15 --out bench/results/ci-soak.json

# editors/vscode compiles with its locked dependencies (npm registry; the extension host cannot run here).
vscode:
	cd editors/vscode && npm ci --no-audit --no-fund && npm run build

install:
	scripts/install.sh

install-test:
	scripts/install.sh test
