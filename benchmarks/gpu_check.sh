#!/usr/bin/env bash
# The GPU check (issues 14 item 7, 58; fits 10 minutes on one H100). From the repository root:
#     bash benchmarks/gpu_check.sh            # on a CUDA machine
#     bash benchmarks/gpu_check.sh --smoke    # on a CPU: tiny models, a few steps, same checks
# Checks, each under `timeout -k` ($LIMIT s, $LIMIT_<name> for one), each ending in one line
# "== check NAME: ok | FAILED (exit N) | skipped (why)", every one run whatever the others did:
#   cuda        torch.version.cuda and the device (first; a CPU torch stops the GPU run here);
#   sync_check  no host synchronisation in the training step of any objective (CUDA only);
#   gpu_bench   ours vs transformers' *ForMaskedLM, fused AdamW on both sides (tokens/s, MFU),
#               ours compiled, apex's FusedAdam when present, exported logits in fp32 against
#               --max-logits-gap;
#   ddp, deepspeed_zero2  the Lightning loop in bf16 (trainer=gpu) on one device under
#               torch.cuda.set_sync_debug_mode("error"): tokens/s and MFU as the run logs them;
#   compile     the same DDP run with trainer.compile=true (vs the eager ddp row);
#   unpadded    ModernBERT's unpadded path (model.unpad=true) through `pretrain`;
#   resume      a run resumed from the ddp run's step-2 GPU checkpoint (its last loss: ddp's);
#   apex        apex's kernels (optim.impl=apex model.layer_norm_impl=apex) vs torch's: losses
#               (skipped, with a line, when apex is absent);
#   local_attention  ModernBERT's local/global vs all-global attention (bench_local_attention).
# Writes the tables to $OUT (default benchmarks/gpu_check.md) and exits 1 naming failed checks.
# $SHARDS: a prepared corpus (default data/builtin); $WORK: scratch; $CHECKS: which to run.
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
LIMIT=${LIMIT:-$(if [ $SMOKE = 1 ]; then echo 300; else echo 150; fi)}
ALL="cuda sync_check gpu_bench ddp deepspeed_zero2 compile unpadded resume apex local_attention"
CHECKS=" ${CHECKS:-$ALL} "
FAILED=()
want() { [[ $CHECKS == *" $1 "* ]]; }
check() { # check NAME COMMAND...: run it under its time limit, print its verdict, go on
	local name=$1 limit="LIMIT_$1" status
	limit=${!limit:-$LIMIT}
	shift
	timeout -k 10 "$limit" "$@"
	status=$?
	if [ $status = 0 ]; then echo "== check $name: ok" >&3; return 0; fi
	echo "== check $name: FAILED (exit $status; 124: over $limit s)" >&3
	FAILED+=("$name")
	return 1
}
skip() { echo "== check $1: skipped ($2)" >&3; }
exec 3>&1 # the verdicts reach the terminal whatever a check's output is redirected to
test -f "$SHARDS/manifest.json" \
	|| $VENV/bin/pretrain-data prepare inputs=[builtin] out_dir="$SHARDS" docs_per_shard=64 \
	|| exit 1

# the Lightning loop with host synchronisations raising on CUDA (a no-op on a CPU)
SYNC_RUN=(-c 'import sys, torch
if torch.cuda.is_available():
    torch.cuda.set_sync_debug_mode("error")
from pretrain.cli.train import console_main
sys.argv[0] = "pretrain"
console_main()')
if [ $SMOKE = 1 ]; then
	echo "== smoke run: CPU, tiny models (the figures say nothing about a GPU)"
	BENCH=(--smoke)
	RUN=(trainer=cpu model=bert_tiny data.max_seq_length=64 data.batch_size=8
		trainer.max_steps=4 trainer.log_every_n_steps=2 data.num_workers=0)
	MODERN=(model=modernbert_tiny)
	WINDOW=(--backends sdpa --lengths 256 --repeats 1)
	COMPILE_BACKEND=eager
else
	nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
	BENCH=(--compile first)
	RUN=(trainer=gpu model=bert_base data.max_seq_length=128 data.batch_size=128
		trainer.max_steps=40 trainer.log_every_n_steps=20 data.num_workers=4)
	MODERN=(model=modernbert_base)
	WINDOW=(--device cuda --train --backends flex sdpa --hidden 768 --heads 12 --layers 3
		--lengths 2048 8192 --rows 8)
	COMPILE_BACKEND=inductor
fi
if want cuda; then
	if [ $SMOKE = 1 ]; then
		check cuda $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
	else
		check cuda $PY -c 'import torch
assert torch.version.cuda, f"torch {torch.__version__} is a CPU build: install a CUDA wheel"
assert torch.cuda.is_available(), "no CUDA device visible"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())' \
			|| { echo "failed: cuda"; exit 1; }
	fi
fi
if want sync_check; then
	if [ $SMOKE = 1 ]; then skip sync_check "CUDA only: tests/integration/test_gpu_check.py runs it on a CPU"
	else check sync_check $PY benchmarks/sync_check.py --shards "$SHARDS" --steps 3; fi
fi
want gpu_bench && check gpu_bench $PY benchmarks/gpu_bench.py "${BENCH[@]}" --out "$WORK/models.md"

RUNS="$WORK/runs.md"
printf '| run | tokens/s | model TFLOP/s | MFU | last loss |\n|---|---:|---:|---:|---:|\n' >"$RUNS"
train() { # train NAME OVERRIDES...: a `pretrain` run in $WORK/run-NAME, its row in $RUNS
	local name=$1
	shift
	check "$name" $PY "${SYNC_RUN[@]}" objective=mlm data=full_sentences data.shards_dir="$SHARDS" \
		trainer.devices=1 logger=csv trainer.enable_progress_bar=false \
		run_dir="$WORK/run-$name" "${RUN[@]}" "$@" >"$WORK/run-$name.log" 2>&1 \
		|| { tail -20 "$WORK/run-$name.log"; return 1; }
	$PY - "$WORK/run-$name" "$name" <<-'PY' | tee -a "$RUNS"
	import csv, sys
	from pathlib import Path
	rows = []
	for path in sorted(Path(sys.argv[1]).glob("csv/version_*/metrics.csv")):
	    rows += list(csv.DictReader(open(path)))
	last = [row for row in rows if row.get("train/tokens_per_s")][-1]
	loss = [row for row in rows if row.get("train/loss")][-1]["train/loss"]
	mfu = f"{float(last['train/mfu']):.1%}" if last.get("train/mfu") else "—"
	print(f"| {sys.argv[2]} | {float(last['train/tokens_per_s']):,.0f} | "
	      f"{float(last['train/model_tflops']):.3g} | {mfu} | {float(loss):.4f} |")
	PY
}
CKPT=(trainer.checkpoint_every_n_steps=2)
want ddp && train ddp strategy=ddp resume=never "${CKPT[@]}"
want deepspeed_zero2 && train deepspeed_zero2 strategy=deepspeed_zero2 resume=never
want compile && train compile strategy=ddp resume=never trainer.compile=true \
	trainer.compile_backend=$COMPILE_BACKEND
want unpadded && train unpadded strategy=ddp resume=never "${MODERN[@]}" model.unpad=true
if want resume; then
	STEP2="$WORK/run-ddp/checkpoints/step-0000002.ckpt" # the ddp run's, written on the GPU
	if [ -f "$STEP2" ]; then
		train resume strategy=ddp resume="$STEP2" "${CKPT[@]}" # its last loss: the ddp row's
	else
		check resume test -f "$STEP2" # the ddp run left none
	fi
fi
if want apex; then
	if $PY -c 'from pretrain.runtime.kernels import apex_extension_available as a
raise SystemExit(not (a("amp_C") and a("fused_layer_norm_cuda")))' && [ $SMOKE = 0 ]; then
		train apex-torch strategy=ddp resume=never optim.impl=torch model.layer_norm_impl=torch \
			&& train apex strategy=ddp resume=never optim.impl=apex model.layer_norm_impl=apex
	else
		skip apex "apex absent (or a CPU): its kernels vs torch's not compared"
	fi
fi
if want local_attention; then
	check local_attention $PY benchmarks/bench_local_attention.py "${WINDOW[@]}" >"$WORK/window.md"
	cat "$WORK/window.md"
fi

for part in models.md runs.md window.md; do
	cat "$WORK/$part" 2>/dev/null && echo
done >"$OUT"
echo
cat "$OUT"
echo "(written to $OUT)"
if [ ${#FAILED[@]} -gt 0 ]; then
	echo "failed: ${FAILED[*]}"
	exit 1
fi
