# `make demo`: set up, prepare the built-in corpus, pretrain a tiny BERT, export it.
# `make test`: set up and run the test suite (`make test-unit`: its fast, in-process layer).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_RUN := runs/demo/bert_tiny-mlm-filled_sentences
DEMO_EXPORT := exports/demo-bert

comma := ,
# `pretrain` exits 75 when a signal (SIGTERM, SIGUSR1: scancel, a time limit) stopped it after
# saving a complete checkpoint: preempted, resumable, NOT finished. Recipes stop on it as on any
# failure, and say so: `cmd || $(call not_finished,how to resume)`.
PREEMPTED := 75
not_finished = { status=$$?; [ $$status -ne $(PREEMPTED) ] || echo "preempted (exit $(PREEMPTED)): \
saved a checkpoint, not finished; to resume: $(1)" >&2; exit $$status; }
# Threads of the demos' training and evaluation processes (torch and OpenMP, exported as
# OMP_NUM_THREADS; trainer.num_threads follows it). One by default: on a 2-core machine others
# were using (load 12-16) the demo ran 0.56 steps/s with 1 thread and 0.10 with 2, every
# operator waiting on a descheduled thread. On an idle machine `make demo DEMO_THREADS=$(nproc)`
# uses every core this make may use (README "The demo's budget and threads").
DEMO_THREADS ?= 1
DEMO_ENV := OMP_NUM_THREADS=$(DEMO_THREADS)
CHINESE_INPUTS := tests/data/chinese_prose.txt$(if $(wildcard ../shared/seeds/*.txt),$(comma)../shared/seeds)

.PHONY: setup demo demo-mix demo-ddp demo-chinese demo-families demo-sweep demo-compress test test-unit golden conf-tables lint clean

# Byte code: pip compiles the installed modules one at a time; `--no-compile`, then compileall
# on every core, writes the same files (setup on 2 cores: 52 s against 87). compileall's
# status is ignored: a few of torch's test files are Python 3.12 syntax, as pip ignores them.
SITE_PACKAGES = $$($(PY) -c "import sysconfig; print(sysconfig.get_path('purelib'))")
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile -e ".[test]"
	$(PY) -m compileall -q -j 0 $(SITE_PACKAGES) >/dev/null || true
	touch $(STAMP)

setup: $(STAMP)

# The built-in corpus (Python's help topics, 565k tokens) with a 2,000-token vocabulary: a
# corpus this small leaves most of an 8,000-token vocabulary's embeddings nearly untrained
# (conf/experiment/demo.yaml).
data/builtin/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare inputs=[builtin] out_dir=data/builtin docs_per_shard=64 \
		tokenizer.vocab_size=2000

demo: $(STAMP) data/builtin/manifest.json
	rm -rf $(DEMO_RUN)
	$(DEMO_ENV) $(VENV)/bin/pretrain experiment=demo || $(call not_finished,$(VENV)/bin/pretrain experiment=demo)
	$(VENV)/bin/pretrain-export $(DEMO_RUN)/checkpoints/last.ckpt $(DEMO_EXPORT) --overwrite
	$(PY) -m pretrain.export.check $(DEMO_EXPORT)

# demo_mix's two sources (issue 55): the built-in corpus's two parts, the help topics and the
# standard library's docstrings, written apart and prepared with data/builtin's tokenizer.
data/builtin-parts/docstrings.txt: | $(STAMP)
	$(PY) -c "from pathlib import Path; from data_pipelines import builtin_corpus as b; \
	p = Path('data/builtin-parts'); p.mkdir(parents=True, exist_ok=True); \
	[(p / f'{n}.txt').write_text(chr(10).join(t + chr(10) for _, t in g()), encoding='utf-8') \
	 for n, g in (('topics', b.pydoc_topic_documents), ('docstrings', b.stdlib_docstring_documents))]"

data/builtin-topics/manifest.json data/builtin-docstrings/manifest.json: data/builtin-%/manifest.json: \
		data/builtin-parts/docstrings.txt data/builtin/manifest.json
	$(VENV)/bin/pretrain-data prepare inputs=[data/builtin-parts/$*.txt] out_dir=data/builtin-$* \
		docs_per_shard=64 tokenizer.path=data/builtin/tokenizer

demo-mix: $(STAMP) data/builtin-topics/manifest.json data/builtin-docstrings/manifest.json
	$(DEMO_ENV) $(VENV)/bin/pretrain experiment=demo_mix

# The demo on 2 CPU ranks (DDP, gloo), long enough to cross epoch ends: every rank ends each
# epoch at the same step, and the tail the ranks did not share equally is printed. Each rank
# takes its share of the cores (trainer.num_threads: null, OMP_NUM_THREADS not exported).
demo-ddp: $(STAMP) data/builtin/manifest.json
	rm -rf runs/demo-ddp
	env -u OMP_NUM_THREADS $(VENV)/bin/pretrain experiment=demo strategy=ddp trainer.devices=2 data.num_workers=0 \
		trainer.max_steps=250 run_dir=runs/demo-ddp logger=csv

data/chinese/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare "inputs=[$(CHINESE_INPUTS)]" out_dir=data/chinese \
		tokenizer.kind=chinese segmenter=jieba docs_per_shard=16

# The built-in corpus with the other tokenizer kinds: GPT-2-style byte-level BPE (RoBERTa, BART,
# GPT) and SentencePiece-style unigram (ALBERT).
data/builtin-bpe/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare inputs=[builtin] out_dir=data/builtin-bpe docs_per_shard=64 \
		tokenizer.kind=bytelevel_bpe tokenizer.lowercase=false

data/builtin-unigram/manifest.json: | $(STAMP)
	$(VENV)/bin/pretrain-data prepare inputs=[builtin] out_dir=data/builtin-unigram docs_per_shard=64 \
		tokenizer.kind=unigram

# Every model family's demo on the built-in corpus, FAMILY_STEPS optimizer steps each; each run
# prints its loss at the first and last logged step. DistilBERT distils the `make demo` BERT.
FAMILY_STEPS ?= 200
FAMILY_DEMOS ?= albert_demo roberta_demo electra_demo xlnet_demo bart_demo mass_demo transformer_demo gpt_demo distilbert_demo
demo-families: $(STAMP) data/builtin/manifest.json data/builtin-bpe/manifest.json data/builtin-unigram/manifest.json
	test -f $(DEMO_RUN)/checkpoints/last.ckpt || $(MAKE) demo
	set -e; log=$$(mktemp); for name in $(FAMILY_DEMOS); do \
		echo "== $$name"; \
		$(DEMO_ENV) $(VENV)/bin/pretrain experiment=$$name trainer.max_steps=$(FAMILY_STEPS) resume=never logger=csv \
			trainer.enable_progress_bar=false >$$log 2>&1 && status=0 || status=$$?; \
		grep -E "loss:|Run directory|rror|preempted" $$log || true; \
		[ $$status -eq 0 ] || (exit $$status) || $(call not_finished,$(VENV)/bin/pretrain experiment=$$name trainer.max_steps=$(FAMILY_STEPS) logger=csv); \
	done; rm -f $$log

# RoBERTa's batch-size experiment in miniature (conf/sweep/roberta_batch_size_tiny.yaml): global
# batch 8 / 32 / 64 over the same samples, one Hydra multirun (a run directory and a wandb run,
# offline without WANDB_API_KEY, per point; held-out curves), then `pretrain-compare` writes
# the report (HTML + PNG figures) and prints its path. A few minutes on 2 CPU cores.
SWEEP_DIR := runs/roberta_batch_size_tiny
demo-sweep: $(STAMP) data/builtin/manifest.json
	rm -rf $(SWEEP_DIR)
	$(DEMO_ENV) $(VENV)/bin/pretrain -m +sweep=roberta_batch_size_tiny trainer.enable_progress_bar=false \
		|| $(call not_finished,$(VENV)/bin/pretrain -m +sweep=roberta_batch_size_tiny)
	$(VENV)/bin/pretrain-compare $(SWEEP_DIR) --out $(SWEEP_DIR)/report

# Chinese BERT-wwm in miniature: show the whole-word masks, then train.
demo-chinese: $(STAMP) data/chinese/manifest.json
	$(VENV)/bin/pretrain-data preview experiment=demo_chinese n=3
	rm -rf runs/demo_chinese
	$(DEMO_ENV) $(VENV)/bin/pretrain experiment=demo_chinese logger=csv

# Fine-tune and probe the `make demo` model and a same-size random encoder on built-in tasks
# (the same recipe for both), 3 seeds each, and print mean +- std side by side
# (pretrain.eval.demo). About 9 minutes on one idle core (60 fits, one after another).
demo-eval: $(STAMP)
	test -f $(DEMO_EXPORT)/config.json || $(MAKE) demo
	$(DEMO_ENV) $(PY) -m pretrain.eval.demo encoder.path=$(DEMO_EXPORT) out_dir=$(DEMO_RUN)

# Compress the `make demo` model every way (conf/compress/method/): TinyBERT distillation into a
# 1-layer, 32-wide student (general, then also task-specific on builtin_order) and into a 2-layer
# MobileBERT student (64-wide body, 16-wide bottleneck), int8 (post-training and
# quantization-aware), head pruning, magnitude and movement pruning to 50%; then
# benchmarks/compression.py prints two tables (and a PNG): each shipped file (model.safetensors,
# int8's model.ts, the head-pruned model.pt2), where it loads without this project (a fresh
# interpreter that cannot import pretrain), size and speed beside the teacher in the same
# runtime; then the retention table (pretrain.compress.retention): every model fine-tuned with
# `pretrain-eval`'s demo recipe on builtin_order over 3 seeds (pruned models keep their zeros,
# int8 is the fine-tuned teacher made int8), beside the teacher and random weights. Trains the
# demo first when exports/demo-bert is missing. Time: README "What each method ships".
DEMO_COMPRESSED := exports/demo-compressed
COMPRESS = $(PY) -m pretrain.compress.cli teacher=$(DEMO_EXPORT) data.shards_dir=data/builtin \
	out_dir=$(DEMO_COMPRESSED)/$(1)
demo-compress: $(STAMP) data/builtin/manifest.json
	test -f $(DEMO_EXPORT)/config.json || $(MAKE) demo
	rm -rf $(DEMO_COMPRESSED)
	$(call COMPRESS,tinybert) method=tinybert student=tinybert_demo
	$(call COMPRESS,tinybert_task) method=tinybert student=tinybert_demo method.task=builtin_order
	$(call COMPRESS,mobilebert) method=tinybert student=mobilebert_demo
	$(call COMPRESS,int8) method=int8
	$(call COMPRESS,int8_qat) method=int8_qat method.qat_steps=50
	$(call COMPRESS,pruned_heads) method=prune_heads
	$(call COMPRESS,pruned_magnitude) method=prune_magnitude
	$(call COMPRESS,pruned_movement) method=prune_movement method.steps=50
	$(PY) benchmarks/compression.py --teacher $(DEMO_EXPORT) --models $(DEMO_COMPRESSED)/* \
		--png $(DEMO_COMPRESSED)/compression.png

# One torch thread per process: the tests run tiny models, often several processes at once
# (data-loader workers, DDP ranks, SLURM tasks), and threads fighting over the cores cost 10x.
# Two lanes at once, each with its own log. In the background the SLURM jobs (SLURM_TESTS, one
# after another: they share the local cluster's nodes and wait on SLURM's signals and time
# limits, a core left idle meanwhile). In the foreground everything else, spread over
# TEST_WORKERS pytest-xdist workers a test at a time (--maxschedchunk 1: a worker gets its
# next test when it is nearly done, so the long ones spread), the longest files first
# (LONGEST_FIRST) so that no long test starts last; runs and corpora that several tests read
# are made once for all workers (`build_once` in tests/conftest.py). The lanes keep both cores
# busy (idle 2-4% of the time): three workers' lane took 10:38 to 12:20 on 2 quiet cores, four
# 12:31 (each test slower), two 12:26 (both cores are not always busy). The background lane's
# output follows, and the target fails if either lane fails.
SLURM_TESTS = tests/multiprocess/test_slurm.py tests/multiprocess/test_slurm_nodes.py
LONGEST_FIRST = tests/integration/test_eval_margin.py tests/integration/test_compress.py \
	tests/multiprocess/test_resume_matrix.py tests/multiprocess/test_distributed.py \
	tests/multiprocess/test_epoch_ends.py tests/multiprocess/test_modernbert_zero.py \
	tests/multiprocess/test_storage_ranks.py tests/multiprocess/test_unilm_zero.py \
	tests/multiprocess/test_killed_launcher.py tests/multiprocess/test_batch_warmup_ranks.py \
	tests/integration/test_compile.py tests/integration/test_gpu_check.py \
	tests/integration/test_objectives_train.py tests/integration/test_storage_s3.py \
	tests/faults/test_fault_processes.py tests/integration/test_checkpointing.py \
	tests/integration/test_zero_compat.py tests/integration/test_stream.py \
	tests/integration/test_prepare.py tests/integration/test_xlnet_objective.py \
	tests/integration/test_install.py tests/integration/test_golden.py \
	tests/integration/test_benchmarks_smoke.py
TEST_WORKERS ?= 3
# Each run makes its own directory under TEST_TMP (mktemp), for the lanes' pytest temporary
# directories and logs, so two `make test` at once never share or delete each other's files;
# it is removed when every lane passed and kept, its path printed, when one failed.
TEST_TMP ?= $(or $(TMPDIR),/tmp)
PYTEST_LANE = OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q --durations=15
test: $(STAMP)
	@tmp=$$(mktemp -d "$(TEST_TMP)/pretrain-tests.XXXXXX") || exit 1; \
	$(PYTEST_LANE) --basetemp=$$tmp/slurm $(SLURM_TESTS) > $$tmp/slurm.log 2>&1 & lane=$$!; \
	trap 'kill $$lane 2>/dev/null' INT TERM; \
	PRETRAIN_TESTS_FIRST="$(LONGEST_FIRST)" $(PYTEST_LANE) -n $(TEST_WORKERS) --dist load --maxschedchunk 1 \
		--basetemp=$$tmp/workers tests/unit tests/integration tests/faults tests/multiprocess \
		$(addprefix --ignore=,$(SLURM_TESTS)); workers=$$?; \
	wait $$lane; slurm=$$?; \
	echo "== $(SLURM_TESTS)"; cat $$tmp/slurm.log; \
	echo "== workers' lane: exit $$workers; SLURM lane: exit $$slurm"; \
	if [ $$workers -eq 0 ] && [ $$slurm -eq 0 ]; then rm -rf $$tmp; \
	else echo "lane logs and temporary files kept in $$tmp"; exit 1; fi

# The unit layer alone (in-process tests: no training run, no subprocess; about a minute on
# 2 idle cores), for running often while editing; `make test` runs it with everything else.
test-unit: $(STAMP)
	@tmp=$$(mktemp -d "$(TEST_TMP)/pretrain-tests.XXXXXX") || exit 1; \
	$(PYTEST_LANE) --basetemp=$$tmp/unit tests/unit && rm -rf $$tmp

# Rewrite the golden loss curves (tests/golden/*.json) from the current code, for a change that
# is meant to alter numerics; commit them with it (tests/integration/test_golden.py).
golden: $(STAMP)
	REGENERATE_GOLDEN=1 OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q tests/integration/test_golden.py

# Rewrite the options tables of README.md and conf/README.md from conf/ after adding, renaming or
# re-describing a config (tests/unit/test_conf_tables.py fails while they are stale).
conf-tables: $(STAMP)
	$(PY) -m pretrain.cli.conf_tables
	$(PY) -m pretrain.cli.params --write-table

lint: $(STAMP)
	$(VENV)/bin/ruff check src data_pipelines tests benchmarks
	$(VENV)/bin/ruff format --check src data_pipelines tests benchmarks

clean:
	rm -rf runs exports data/builtin data/builtin-bpe data/builtin-unigram data/chinese \
		data/builtin-parts data/builtin-topics data/builtin-docstrings
