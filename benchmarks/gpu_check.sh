#!/usr/bin/env bash
# The GPU check (issue 14 item 7; about 8 minutes on one H100/H200-class GPU). Run from the
# repository root after `make setup`:
#     bash benchmarks/gpu_check.sh            # on a CUDA machine
#     bash benchmarks/gpu_check.sh --smoke    # on a CPU: tiny models, a few steps, same path
# It prints its tables as it goes and writes them to $OUT (default benchmarks/gpu_check.md):
#   1. (CUDA) issue 18: no host synchronisation in the training step of any objective;
#   2. gpu_bench.py: BERT-base and RoBERTa-base at seq 128 and 512 in bf16, ours vs transformers'
#      *ForMaskedLM on the same batches (tokens/s, model TFLOP/s, MFU, peak memory), ours
#      compiled or not (compiled at the first model and length only: each compile costs about a
#      minute), apex's FusedAdam vs torch's fused AdamW when apex is present, and the exported
#      model's logits vs ours;
#   3. DDP vs DeepSpeed ZeRO-2 on one device: short `pretrain` runs (trainer=gpu), their
#      tokens/s and MFU as the run logs them;
#   4. ModernBERT's local/global attention vs all-global (bench_local_attention.py): time and
#      peak memory per token at 2,048 and 8,192 tokens (8 rows), FlexAttention and SDPA, bf16
#      training.
# Every check runs, each under its own time limit ($LIMIT seconds, default 240, 900 for
# --smoke; $LIMIT_<name> for one check: LIMIT_gpu_bench, LIMIT_sync_check, ...), so that one
# failure or hang does not cost the others on a short GPU lease; the script exits non-zero when
# any failed and names them. $SHARDS: a prepared corpus (default data/builtin, prepared when
# missing); $WORK: scratch (default a new temporary directory); $CHECKS: which to run (default
# all: sync_check gpu_bench strategies local_attention), to finish a cut-off lease.
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python
SMOKE=0
if [ "${1:-}" = --smoke ]; then SMOKE=1; fi
OUT=${OUT:-benchmarks/gpu_check.md}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
SHARDS=${SHARDS:-data/builtin}
LIMIT=${LIMIT:-$(if [ $SMOKE = 1 ]; then echo 900; else echo 240; fi)} # smoke: a loaded CPU
FAILED=()
CHECKS=" ${CHECKS:-sync_check gpu_bench strategies local_attention} "
want() { [[ $CHECKS == *" $1 "* ]]; }
check() { # check NAME COMMAND...: run it under the time limit, note a failure, go on
	local name=$1 limit="LIMIT_$1"
	limit=${!limit:-$LIMIT}
	shift
	timeout "$limit" "$@" && return
	echo "!! $name failed (exit $?; 124: over $limit s)"
	FAILED+=("$name")
	return 1
}
test -f "$SHARDS/manifest.json" \
	|| $VENV/bin/pretrain-data prepare inputs=[builtin] out_dir="$SHARDS" docs_per_shard=64 \
	|| exit 1

if [ $SMOKE = 1 ]; then
	echo "== smoke run: CPU, tiny models (the figures say nothing about a GPU)"
	BENCH=(--smoke)
	RUN=(trainer=cpu model=bert_tiny data.max_seq_length=64 data.batch_size=8
		trainer.max_steps=4 trainer.log_every_n_steps=2 data.num_workers=0)
	WINDOW=(--backends sdpa --lengths 256 --repeats 1)
else
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
	$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (use --smoke on a CPU)'" \
		|| exit 1
	if want sync_check; then
		echo "== sync-free training step, every objective"
		check sync_check $PY benchmarks/sync_check.py --shards "$SHARDS" --steps 3
	fi
	BENCH=(--compile first)
	RUN=(trainer=gpu model=bert_base data.max_seq_length=128 data.batch_size=256
		trainer.max_steps=60 trainer.log_every_n_steps=20 data.num_workers=4)
	WINDOW=(--device cuda --train --backends flex sdpa --hidden 768 --heads 12 --layers 3
		--lengths 2048 8192 --rows 8)
fi

want gpu_bench && echo "== ours vs transformers, compile, apex, exported logits" \
	&& check gpu_bench $PY benchmarks/gpu_bench.py "${BENCH[@]}" --out "$WORK/models.md"

if want strategies; then
	echo "== DDP vs ZeRO-2 on one device"
	STRATEGIES="$WORK/strategies.md"
	printf '| strategy | tokens/s | model TFLOP/s | MFU |\n|---|---:|---:|---:|\n' >"$STRATEGIES"
	for strategy in ddp deepspeed_zero2; do
		check "$strategy" $VENV/bin/pretrain objective=mlm data=full_sentences data.shards_dir="$SHARDS" \
			strategy=$strategy trainer.devices=1 logger=csv trainer.enable_progress_bar=false \
			run_dir="$WORK/run-$strategy" resume=never "${RUN[@]}" >"$WORK/run-$strategy.log" 2>&1 \
			|| { tail -20 "$WORK/run-$strategy.log"; continue; }
		$PY - "$WORK/run-$strategy" "$strategy" <<-'PY' | tee -a "$STRATEGIES"
	import csv, sys
	from pathlib import Path
	rows = list(csv.DictReader(open(next(Path(sys.argv[1]).glob("csv/version_*/metrics.csv")))))
	last = [row for row in rows if row.get("train/tokens_per_s")][-1]
	mfu = f"{float(last['train/mfu']):.1%}" if last.get("train/mfu") else "—"
	print(f"| {sys.argv[2]} | {float(last['train/tokens_per_s']):,.0f} | "
	      f"{float(last['train/model_tflops']):.3g} | {mfu} |")
	PY
	done
fi

if want local_attention; then
	echo "== ModernBERT: local/global vs all-global attention per token"
	check local_attention $PY benchmarks/bench_local_attention.py "${WINDOW[@]}" >"$WORK/window.md"
	cat "$WORK/window.md"
fi

for part in models.md strategies.md window.md; do
	cat "$WORK/$part" 2>/dev/null && echo
done >"$OUT"
echo
cat "$OUT"
echo "(written to $OUT)"
if [ ${#FAILED[@]} -gt 0 ]; then
	echo "failed: ${FAILED[*]}"
	exit 1
fi
