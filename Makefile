# Two commands set everything up on a fresh machine (CPU, package registries only):
#   make quickstart   prepare the embedded Shakespeare corpus, train a small GPT, print val loss and a sample
#   make test         the whole test suite (what CI runs)
#   make test-fast    the model and kernel specification: the tests not marked slow
#   make gpu-check    on a GPU machine: the kernels checked and timed, one report to send (README)
# Both install requirements.txt at the versions in constraints.txt: the ones the test suite
# last passed with. `make constraints` moves them to the newest releases (see README).
PY := .venv/bin/python

.venv/installed: requirements.txt constraints.txt
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip -c constraints.txt
	.venv/bin/pip install --quiet -r requirements.txt -c constraints.txt
	touch $@

venv: .venv/installed

data/shakespeare_char/train.bin: .venv/installed
	$(PY) prepare_shakespeare.py --only=char

quickstart: .venv/installed data/shakespeare_char/train.bin
	$(PY) train.py config/quickstart.py
	$(PY) sample.py --out_dir=out-quickstart --start="ROMEO:" --max_new_tokens=300

test: .venv/installed
	$(PY) -m pytest -q tests

test-fast: .venv/installed
	$(PY) -m pytest -q -m "not slow" tests

bench: .venv/installed
	$(PY) bench.py --out bench.json

# On a GPU machine, your first run there: 8 minutes, then send us gpu_check_out/gpu_check.md (README)
gpu-check: .venv/installed
	PYTHON=$(PY) bash tools/gpu_check.sh

# The newest releases of everything in requirements.txt, in a virtualenv of their own
# (.venv-latest); the whole suite runs there, and only if it passes are the versions
# written to constraints.txt (commit it; the next `make test` installs them).
constraints:
	rm -rf .venv-latest
	python3 -m venv .venv-latest
	.venv-latest/bin/pip install --quiet --upgrade pip
	.venv-latest/bin/pip install --quiet -r requirements.txt
	.venv-latest/bin/python -m pytest -q tests
	(echo '# The versions the whole test suite last passed with (written by `make constraints`;'; \
	 echo '# `make` installs requirements.txt with these: pip install -r requirements.txt -c constraints.txt).'; \
	 .venv-latest/bin/pip freeze --all --exclude-editable | sed -E 's/\+[a-z0-9.]+$$//') > constraints.txt.tmp
	mv constraints.txt.tmp constraints.txt
	@echo "constraints.txt now holds the versions that passed; commit it"

.PHONY: venv quickstart test test-fast bench gpu-check constraints
