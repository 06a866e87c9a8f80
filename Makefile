# Thin shims over nox (the task runner) so a fresh machine needs nothing but python3 and make.
# The tools live in .tools/ (a private venv), so no global pip install is needed.
TOOLS := .tools
NOX := $(TOOLS)/bin/nox

.PHONY: demo test compat check samples docs bench

$(NOX):
	python3 -m venv $(TOOLS)
	$(TOOLS)/bin/pip install --quiet --disable-pip-version-check nox uv

demo: $(NOX)  ## start local emulators and run the sample worker on a few jobs
	$(NOX) -s demo

test: $(NOX)  ## the test suite against the real emulators
	$(NOX) -s tests

compat: $(NOX)  ## unit and contract tests on Python 3.10, 3.12 and 3.13
	$(NOX) -s compat

check: $(NOX)  ## ruff and mypy --strict
	$(NOX) -s lint typecheck

samples: $(NOX)  ## every sample, end to end
	$(NOX) -s samples

docs: $(NOX)  ## the documentation site in site/ (mkdocs build --strict)
	$(NOX) -s docs

bench: $(NOX)  ## throughput and memory vs the stock client
	$(NOX) -s bench
