# Two commands set up everything from nothing: `make demo` (pre-train a tiny T5 on CPU) and
# `make test` (the whole fast test suite). Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN    ?= runs/demo

.PHONY: demo test test-adapters test-slow bench docs clean

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
	$(MAKE) test-adapters

# The `adapters` package (the reference for Houlsby/Pfeiffer adapters) pins transformers 4.57, so its
# parity tests run in a venv of their own: adapters, transformers and torch there, every other
# package read from .venv.
ADAPTERS_VENV ?= .venv-adapters
$(ADAPTERS_VENV)/.installed: pyproject.toml $(VENV)/.installed-test
	$(PYTHON) -m venv $(ADAPTERS_VENV)
	$(ADAPTERS_VENV)/bin/pip install -q "adapters==1.3.*" "transformers>=4.57,<4.58" "torch==2.13.0"
	$(BIN)/python -c "import site; print(site.getsitepackages()[0])" > \
	    "$$($(ADAPTERS_VENV)/bin/python -c 'import site; print(site.getsitepackages()[0])')/t5lite-venv.pth"
	touch $@

test-adapters: $(ADAPTERS_VENV)/.installed
	$(ADAPTERS_VENV)/bin/python -c "import adapters, transformers; print('adapters', adapters.__version__, 'on transformers', transformers.__version__)"
	PYTHONPATH=$(CURDIR) $(ADAPTERS_VENV)/bin/python -m pytest -p no:cacheprovider -q tests/test_peft_adapters.py -k package

test-slow: $(VENV)/.installed-test
	$(BIN)/python -m pytest -m slow --durations=15

bench: $(VENV)/.installed-test
	$(BIN)/python benchmarks/train_throughput.py

docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(ADAPTERS_VENV) runs site
