#!/usr/bin/env bash
# Train the embedded model on a lent GPU machine (one `run` call, < 10 min).
#   run: bash training/device_train.sh
# $OUT gets: target.safetensors (copied as soon as the target is trained),
# artefacts.tar.gz (everything else), log.txt. Unpack with training/unpack.sh.
set -euo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15 TOKENIZERS_PARALLELISM=true
OUT="${OUT:-/tmp/qd-out}"; mkdir -p "$OUT"
nvidia-smi -L || true
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'
# A toy run first: an API difference fails here within a minute, not after eight.
python3 -m training.pipeline --out /tmp/qd-smoke --smoke --budget-s "${SMOKE_BUDGET_S:-20}" > /tmp/qd-smoke.log 2>&1 || { tail -40 /tmp/qd-smoke.log; exit 1; }
echo "smoke ok"
python3 -m training.pipeline --out /tmp/qd --budget-s "${BUDGET_S:-500}" --copy-to "$OUT" 2>&1 | tee "$OUT/log.txt" | grep -v '%|' || true
rm -f /tmp/qd/target/model.safetensors.tmp
tar czf "$OUT/artefacts.tar.gz" -C /tmp/qd --exclude=target/model.safetensors .
ls -la "$OUT"
