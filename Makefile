# One command each: `make demo` runs the quickstart, `make test` runs the whole suite, `make lint`
# runs ruff (rules in pyproject.toml) and mypy on the three packages.
# All three create the virtualenv on first use. VENV may point elsewhere (CI keeps it outside the
# clone, keyed by a hash of requirements.txt).
# `make test` needs nothing but the clone: tests that need the full datasets (RAYMM_DATA) or an
# sshd are skipped with a reason saying how to provide them; RAYMM_REQUIRE_DATA=1 and
# RAYMM_REQUIRE_SSHD=1 make those tests fail instead of skipping (CI sets both: .ci/run).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.raymm-installed
PYTEST_ARGS ?=
# `make test` runs the suite in this many worker processes (pytest-xdist), then the tests marked
# `alone` (they stop every Ray on the machine) by themselves; 1 runs it in one process
TEST_WORKERS ?= 2

.PHONY: venv demo test test-fast lint bench clean
LINTED := raymm actors policies tests tools experiments examples

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# torch/torchaudio/torchvision first and by exact pin, so pip never picks a multi-GB build
	$(PY) -m pip install -q $$(grep -E '^torch(audio|vision)?==' requirements.txt)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	@touch $(STAMP)

demo: venv
	$(VENV)/bin/raymm run scenarios/quickstart.yaml

# pytest exits 5 when a selection holds no test (PYTEST_ARGS naming tests of one kind only)
test: venv
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not alone" $(PYTEST_ARGS) \
		|| [ $$? -eq 5 ]
	$(PY) -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-fast: venv
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" $(PYTEST_ARGS)

lint: venv
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/mypy raymm actors policies

clean:
	rm -rf runs .pytest_cache
