# Two commands set up everything from nothing: `make demo` (pre-train a tiny T5 on CPU) and
# `make test` (the whole fast test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN    ?= runs/demo

.PHONY: demo test test-slow bench bench-accelerator docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-core: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e ".[test,hf,reference,tpu,docs]"
	$(BIN)/pip install -q --no-deps "t5==0.9.4"
	touch $@ $(VENV)/.installed-core

demo: $(VENV)/.installed-core
	$(BIN)/t5lite train --gin_file=configs/local/t5_tiny_pretrain.gin --gin.MODEL_DIR="'$(RUN)'"

test: $(VENV)/.installed-test
	$(BIN)/python -m pytest -n 2 --durations=15

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow --durations=15

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/train_throughput.py

bench-accelerator: $(VENV)/.installed-test
	$(BIN)/python benchmarks/accelerator.py --out runs/accelerator

docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) runs site
