#!/usr/bin/env bash
# Drafters for the candidate target, several processes on one GPU, in one `run` call (< 10 min):
#   run: bash training/device_drafters.sh      (carry training/candidate)
# EAGLE3_ARGS / P_EAGLE_ARGS: extra arguments of training/drafter_scratch.py per role;
# EAGLE3B_ARGS, when set, starts a second eagle3 process (give it --tag=...).
# $OUT gets results.tar (per process a log, a summary and a tar of the weights) and device_log.txt.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
OUT="${OUT:-/tmp/qd-out}"; mkdir -p "$OUT"
TARGET="${TARGET:-training/candidate/target}"; OLD="${OLD:-training/candidate}"
DEADLINE_S="${DEADLINE_S:-540}"
nvidia-smi -L || true
rm -rf /tmp/ds /tmp/ds-share /tmp/ds-res
common=(--target "$TARGET" --old "$OLD" --out /tmp/ds --share /tmp/ds-share --results /tmp/ds-res --deadline-s "$DEADLINE_S")
python3 -m training.drafter_scratch --role eagle3 "${common[@]}" ${EAGLE3_ARGS:-} > /tmp/ds-e.txt 2>&1 &
pe=$!
pb=""
if [ -n "${EAGLE3B_ARGS:-}" ]; then
  python3 -m training.drafter_scratch --role eagle3 "${common[@]}" $EAGLE3B_ARGS > /tmp/ds-b.txt 2>&1 &
  pb=$!
fi
python3 -m training.drafter_scratch --role p-eagle "${common[@]}" ${P_EAGLE_ARGS:-} > /tmp/ds-p.txt 2>&1 &
pp=$!
wait $pe; re=$?
rb=-; [ -n "$pb" ] && { wait $pb; rb=$?; }
wait $pp; rp=$?
{ echo "== eagle3 rc=$re"; grep -v '%|' /tmp/ds-e.txt; echo "== eagle3 b rc=$rb"; [ -n "$pb" ] && grep -v '%|' /tmp/ds-b.txt
  echo "== p-eagle rc=$rp"; grep -v '%|' /tmp/ds-p.txt; } > "$OUT/device_log.txt"
tar cf "$OUT/results.tar" -C /tmp/ds-res .
grep -hE 'card_measure|held256|"old"|after_pass|generated|with_share|gen256|"steps"|done|Error|error' /tmp/ds-e.txt /tmp/ds-b.txt /tmp/ds-p.txt 2>/dev/null | cut -c1-600
ls -la "$OUT"
