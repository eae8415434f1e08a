# One entry point for set-up, demo, tests and benchmarks. Every target sets up .venv itself on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
OUT := out

.PHONY: setup demo test test-all bench lock clean

setup: $(STAMP)

$(STAMP): requirements.lock setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The demo: plan on the bundled sample image with the embedded default model; prints the plan, draws a PNG.
demo: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/wamdiff-plan --model tiny-random --command left --velocity 6.0 0.0 --draw $(OUT)/demo_plan.png

# The test command CI runs (slow tests are excluded; `make test-all` runs them too).
test: $(STAMP)
	$(PY) -m pytest -m "not slow" -n 2

test-all: $(STAMP)
	$(PY) -m pytest -n 2

bench: $(STAMP)
	mkdir -p $(OUT)
	$(VENV)/bin/wamdiff-bench decode --json $(OUT)/bench_decode.json

lock:
	rm -rf /tmp/wamdiff-lock-venv && $(PYTHON) -m venv /tmp/wamdiff-lock-venv
	/tmp/wamdiff-lock-venv/bin/pip install --quiet torch==2.13.0 -e '.[test]'
	/tmp/wamdiff-lock-venv/bin/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/' > requirements.lock.new
	mv requirements.lock.new requirements.lock

clean:
	rm -rf $(OUT) .pytest_cache build *.egg-info
