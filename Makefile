# The two commands of README.md.
.PHONY: serve test install install-test

serve: install
	.venv/bin/quickdraft serve

test: install-test
	.venv/bin/python -m pytest -q -ra

install:
	scripts/install.sh

install-test:
	scripts/install.sh test
