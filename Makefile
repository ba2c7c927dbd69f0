# `make demo`: set up, prepare the built-in corpus, pretrain a tiny BERT, export it.
# `make test`: set up and run the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_RUN := runs/demo/bert_tiny-mlm_nsp-segment_pair
DEMO_EXPORT := exports/demo-bert

comma := ,
CHINESE_INPUTS := tests/data/chinese_prose.txt$(if $(wildcard ../shared/seeds/*.txt),$(comma)../shared/seeds)

.PHONY: setup demo demo-chinese test lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

data/builtin/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare inputs=[builtin] out_dir=data/builtin docs_per_shard=64

demo: $(STAMP) data/builtin/manifest.json
	rm -rf $(DEMO_RUN)
	$(VENV)/bin/pretrain experiment=demo
	$(VENV)/bin/pretrain-export $(DEMO_RUN)/checkpoints/last.ckpt $(DEMO_EXPORT) --overwrite
	$(PY) -m pretrain.export.check $(DEMO_EXPORT)

data/chinese/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare "inputs=[$(CHINESE_INPUTS)]" out_dir=data/chinese \
		tokenizer.kind=chinese segmenter=jieba docs_per_shard=16

# Chinese BERT-wwm in miniature: show the whole-word masks, then train.
demo-chinese: $(STAMP) data/chinese/manifest.json
	$(VENV)/bin/pretrain-data preview experiment=demo_chinese n=3
	rm -rf runs/demo_chinese
	$(VENV)/bin/pretrain experiment=demo_chinese logger=csv

test: $(STAMP)
	$(VENV)/bin/pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src data_pipelines tests benchmarks
	$(VENV)/bin/ruff format --check src data_pipelines tests benchmarks

clean:
	rm -rf runs exports data/builtin data/chinese
