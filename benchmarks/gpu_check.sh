#!/usr/bin/env bash
# The GPU check (issue 14 item 7; about 8 minutes on one H100/H200-class GPU). Run from the
# repository root after `make setup`:
#     bash benchmarks/gpu_check.sh            # on a CUDA machine
#     bash benchmarks/gpu_check.sh --smoke    # on a CPU: tiny models, a few steps, same path
# It prints one table and writes it to $OUT (default benchmarks/gpu_check.md):
#   1. (CUDA) issue 18: no host synchronisation in the training step of any objective;
#   2. gpu_bench.py: BERT-base and RoBERTa-base at seq 128 and 512 in bf16, ours vs transformers'
#      *ForMaskedLM on the same batches (tokens/s, model TFLOP/s, MFU, peak memory), ours
#      compiled or not, apex's FusedAdam vs torch's fused AdamW when apex is present, and the
#      exported model's logits vs ours;
#   3. DDP vs DeepSpeed ZeRO-2 on one device: short `pretrain` runs (trainer=gpu), their
#      tokens/s and MFU as the run logs them;
#   4. ModernBERT's local/global attention vs all-global (bench_local_attention.py): time and
#      peak memory per token from 512 to 8,192 tokens, FlexAttention and SDPA, bf16 training.
# Exits non-zero at the first check that fails. $SHARDS: a prepared corpus (default
# data/builtin, prepared when missing); $WORK: scratch (default a new temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python
SMOKE=0
if [ "${1:-}" = --smoke ]; then SMOKE=1; fi
OUT=${OUT:-benchmarks/gpu_check.md}
WORK=${WORK:-$(mktemp -d)}
SHARDS=${SHARDS:-data/builtin}
test -f "$SHARDS/manifest.json" \
	|| $VENV/bin/pretrain-data prepare inputs=[builtin] out_dir="$SHARDS" docs_per_shard=64

if [ $SMOKE = 1 ]; then
	echo "== smoke run: CPU, tiny models (the figures say nothing about a GPU)"
	BENCH=(--smoke)
	RUN=(trainer=cpu model=bert_tiny data.max_seq_length=64 data.batch_size=8
		trainer.max_steps=4 trainer.log_every_n_steps=2 data.num_workers=0)
	WINDOW=(--backends sdpa --lengths 256 --repeats 1)
else
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
	$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (use --smoke on a CPU)'"
	echo "== sync-free training step, every objective"
	$PY benchmarks/sync_check.py --shards "$SHARDS" --steps 3
	BENCH=()
	RUN=(trainer=gpu model=bert_base data.max_seq_length=128 data.batch_size=64
		trainer.max_steps=40 trainer.log_every_n_steps=20 data.num_workers=4)
	WINDOW=(--device cuda --train --backends flex sdpa --hidden 768 --heads 12 --layers 3)
fi

echo "== ours vs transformers, compile, apex, exported logits"
$PY benchmarks/gpu_bench.py "${BENCH[@]}" --out "$WORK/models.md"

echo "== DDP vs ZeRO-2 on one device"
STRATEGIES="$WORK/strategies.md"
printf '| strategy | tokens/s | model TFLOP/s | MFU |\n|---|---:|---:|---:|\n' >"$STRATEGIES"
for strategy in ddp deepspeed_zero2; do
	$VENV/bin/pretrain objective=mlm data=full_sentences data.shards_dir="$SHARDS" \
		strategy=$strategy trainer.devices=1 logger=csv trainer.enable_progress_bar=false \
		run_dir="$WORK/run-$strategy" resume=never "${RUN[@]}" >"$WORK/run-$strategy.log" 2>&1 \
		|| { tail -20 "$WORK/run-$strategy.log"; exit 1; }
	$PY - "$WORK/run-$strategy" "$strategy" >>"$STRATEGIES" <<'PY'
import csv, sys
from pathlib import Path
rows = list(csv.DictReader(open(next(Path(sys.argv[1]).glob("csv/version_*/metrics.csv")))))
last = [row for row in rows if row.get("train/tokens_per_s")][-1]
mfu = f"{float(last['train/mfu']):.1%}" if last.get("train/mfu") else "—"
print(f"| {sys.argv[2]} | {float(last['train/tokens_per_s']):,.0f} | "
      f"{float(last['train/model_tflops']):.3g} | {mfu} |")
PY
done

echo "== ModernBERT: local/global vs all-global attention per token"
$PY benchmarks/bench_local_attention.py "${WINDOW[@]}" >"$WORK/window.md"

{ cat "$WORK/models.md"; echo; cat "$STRATEGIES"; echo; cat "$WORK/window.md"; } >"$OUT"
echo
cat "$OUT"
echo "(written to $OUT)"
