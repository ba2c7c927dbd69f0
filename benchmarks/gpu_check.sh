#!/usr/bin/env bash
# Checks that need a CUDA machine (the CPU development machine cannot run them). Run from the
# repository root after `make setup`:  bash benchmarks/gpu_check.sh
# Exits non-zero at the first check that fails.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print('torch', torch.__version__, torch.cuda.get_device_name())"
test -f data/builtin/manifest.json \
	|| $VENV/bin/pretrain-data prepare inputs=[builtin] out_dir=data/builtin docs_per_shard=64

# Issue 18: no host synchronisation in the training step of any objective. A few steps of
# each (forward, loss, backward, optimizer step) under torch.cuda.set_sync_debug_mode("error"),
# the first (a logging step, lazy initialisation) excepted; prints one line per objective.
echo "== sync-free training step, every objective"
$PY benchmarks/sync_check.py --shards data/builtin --steps 3
