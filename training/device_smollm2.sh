#!/usr/bin/env bash
# The SmolLM2-135M FIM fine-tune (training/smollm2_fim.py) on a lent GPU machine,
# which has no network: the base's GGUF (94 MiB) travels in parts, one per `run`
# call, beside the working tree (64 MiB a call in all; `pack` sizes the parts to fit).
#
# Here, on the CPU machine (needs the registry once; writes .devcarry/smollm2/, git-ignored):
#   bash training/device_smollm2.sh pack        # prints the part count, N+1 parts: part0..partN
# Then one `run` call per part on one warm machine (carried files stay there between calls):
#   carry [".devcarry/smollm2/part0"]  command: bash training/device_smollm2.sh smoke
#        (wheels + first GGUF piece; the smoke run on a tiny random base checks the device's torch/transformers)
#   carry [".devcarry/smollm2/partI"]  command: bash training/device_smollm2.sh have      (I = 1 .. N-1)
#   carry [".devcarry/smollm2/partN"]  command: TRAIN_S=360 bash training/device_smollm2.sh train
#        (joins and checks the GGUF, dequantizes it as the installer does, checks the weights' pinned SHA-256,
#         then the fine-tune: ~2 min of corpus, samples and encoding, TRAIN_S of training, ~30 s of checks;
#         keep the sum under the 600 s a call may run. $OUT gets the delta, log and summary)
# A run longer than one call: STOP_AFTER=S ends the train call's training after S seconds (the schedule spans
# TRAIN_S) and keeps its state and data in /tmp/fim; then, on the same warm machine, with no carry:
#   command: TRAIN_S=<same> bash training/device_smollm2.sh resume          ($OUT: the delta, log and summary)
# Drafters for a delta (training/smollm2_drafter.py): carry the delta's folder beside the last part instead of `train`:
#   carry [".devcarry/smollm2/partN", ".devcarry/smollm2-fim-run6"]
#   command: DELTA=.devcarry/smollm2-fim-run6 DRAFT_S=240 bash training/device_smollm2.sh drafters
#   ($OUT: drafters.tar in pieces, log and summary; here: cat drafters.tar.part-* | tar -x). A run longer than
#   the call goes on; follow it with calls of `bash training/device_smollm2.sh drafters-wait` (no carry).
# Back here: copy $OUT/delta/ to quickdraft/models/smollm2-135m-fim/ (a delta over 15 MiB comes in pieces:
# cat delta.safetensors.part-* > delta.safetensors), pin its SHA-256 and the built
# weights' in server/model_cache.py MODELS (quickdraft model build smollm2-135m-fim --force prints it).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.devcarry/smollm2
# Parts as large as a call allows: the tracked tree + one part + part0's wheels (~3 MiB)
# under 60 MiB of the 64 MiB a call carries.
tree_mib() { git ls-files -z | du -cb --files0-from=- | tail -1 | awk '{print int($1 / 1048576) + 1}'; }
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
# What the device image lacks (it has torch, transformers, tokenizers, safetensors, numpy):
# the GGUF reader, accelerate (transformers' GGUF loader wants it), their psutil and pyyaml, the bridge's tree-sitter and LSP types.
WHEELS=(gguf==0.19.0 accelerate==1.16.0 psutil pyyaml tree-sitter==0.25.2 tree-sitter-python lsprotocol pygls cattrs attrs)
site() { # the wheels, unzipped (pure zip archives: no pip needed there)
  mkdir -p "$DIR/site"
  for w in "$DIR"/part0/wheels/*.whl; do python3 -m zipfile -e "$w" "$DIR/site"; done
}
export PYTHONPATH="$PWD:$PWD/$DIR/site" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=15 TOKENIZERS_PARALLELISM=true
OUT="${OUT:-/tmp/qd-out}"
deliver() {
  # Files come back from $OUT only up to 16 MiB each: larger ones (a rank-32 delta is 19.7 MB) in pieces, joined here
  # with cat F.part-* > F (their SHA-256 is in the log above).
  find "$OUT" -type f -size +15M | while read -r f; do sha256sum "$f"; split -b 15M -d -a 1 "$f" "$f.part-" && rm "$f"; done
  ls -laR "$OUT"
}
base() {  # the installer's own build (server/model_cache.py) into /tmp/base, its pinned SHA-256 checked
  [ -d "$DIR/site" ] || site
  [ -f /tmp/base/MANIFEST.json ] && return
  cat "$DIR"/part*/gguf.* > /tmp/smollm2.gguf
  echo "$GGUF_SHA  /tmp/smollm2.gguf" | sha256sum -c -
  python3 -c 'import sys; from pathlib import Path; from training import context_samples; context_samples.ensure_bridge()
from quickdraft.server import model_cache as m
m.build("smollm2-135m-base", out=Path("/tmp/base"), gguf=Path("/tmp/smollm2.gguf"), progress=False)'
}

case "${1:-}" in
pack)
  PY=${PY:-.venv/bin/python}
  gguf=$($PY -c 'from quickdraft.server import model_cache as m; print(m.locate_gguf(m.SMOLLM2_135M))')
  # A part holds PART_MIB beside the tree (the 64-MiB count goes by 4-KiB blocks: 2 MiB kept spare); part0 less
  # by the wheels (~3 MiB); the last part is the remainder, small enough to travel with a delta (`drafters`).
  PART_MIB=${PART_MIB:-$((62 - $(tree_mib)))}
  rm -rf "$DIR" && mkdir -p "$DIR/part0/wheels"
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d "$DIR/part0/wheels" "${WHEELS[@]}"
  python3 - "$gguf" "$DIR" "$PART_MIB" <<'PY'
import os, sys
src, out, part = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 20
wheels = sum(os.path.getsize(os.path.join(out, "part0", "wheels", w)) for w in os.listdir(os.path.join(out, "part0", "wheels")))
with open(src, "rb") as f:
    i, size = 0, part - wheels
    while chunk := f.read(size):
        os.makedirs(f"{out}/part{i}", exist_ok=True)
        with open(f"{out}/part{i}/gguf.{i}", "wb") as g:
            g.write(chunk)
        i, size = i + 1, part
PY
  du -sh "$DIR"/part*; echo "parts: $(ls -d "$DIR"/part* | wc -l)"; echo "tree: $(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1) bytes tracked"
  ;;
have)
  ls -la "$DIR"/part*/ ;;
smoke)
  nvidia-smi -L || true
  site
  python3 -c 'import torch, transformers, gguf, accelerate, tree_sitter_python; print("torch", torch.__version__, "transformers", transformers.__version__)'
  python3 -m training.smollm2_fim --smoke --out /tmp/smk --max-steps 20 2>&1 | tail -5 ;;
train)
  mkdir -p "$OUT"
  base  # the delta is trained on exactly the base users build
  python3 -m training.smollm2_fim --base /tmp/base --out /tmp/fim --results "$OUT" --seconds "${TRAIN_S:-360}" ${FIM_ARGS:-} \
      ${STOP_AFTER:+--stop-after "$STOP_AFTER"} 2>&1 | tee "$OUT/log.txt" | grep -v '%|' || true
  [ -n "${STOP_AFTER:-}" ] && { ls -la /tmp/fim; exit 0; }
  deliver ;;
resume)
  mkdir -p "$OUT"
  python3 -m training.smollm2_fim --base /tmp/base --out /tmp/fim --results "$OUT" --seconds "${TRAIN_S:-360}" ${FIM_ARGS:-} \
      --resume 2>&1 | tee "$OUT/log.txt" | grep -v '%|' || true
  deliver ;;
drafters)
  # Drafters for a FIM delta carried beside the last part (DELTA=its folder, e.g. .devcarry/smollm2-fim-run6):
  # the target is built as the installer would build it, then training/smollm2_drafter.py for DRAFT_S seconds.
  # The run goes on in its own session, so it may outlive this call: when it is not done after WAIT_S
  # seconds (540), later calls on the same warm machine, with no carry, follow it with `drafters-wait`.
  mkdir -p "$OUT"
  base
  [ -f "${DELTA:?DELTA=the carried delta folder}/delta.safetensors" ] || cat "$DELTA"/delta.safetensors.part-* > "$DELTA/delta.safetensors"
  python3 -c 'import sys; from pathlib import Path; from training import context_samples; context_samples.ensure_bridge()
from quickdraft.server import model_cache as m
m.MODELS["fim"] = m.CachedModel("fim", m.SMOLLM2_135M, Path(sys.argv[1]), None, "the carried delta")
m.build("fim", out=Path("/tmp/target"), gguf=Path("/tmp/smollm2.gguf"), progress=False)' "$DELTA"
  sha256sum /tmp/target/model.safetensors "$DELTA/delta.safetensors" | tee /tmp/drafters-sha.txt
  rm -rf /tmp/drafters-results /tmp/drafters.rc && mkdir -p /tmp/drafters-results
  setsid nohup bash -c 'python3 -m training.smollm2_drafter --target /tmp/target --out /tmp/drafters --results /tmp/drafters-results \
      --seconds "${DRAFT_S:-240}" ${DRAFT_ARGS:-} > /tmp/drafters-results/log.txt 2>&1; echo $? > /tmp/drafters.rc' \
      > /dev/null 2>&1 < /dev/null &
  bash "$0" drafters-wait ;;
drafters-wait)
  # Follows the run for up to WAIT_S seconds; when it has ended, brings its results (drafters.tar in pieces,
  # log and summary; here: cat drafters.tar.part-* | tar -x).
  mkdir -p "$OUT"
  end=$((SECONDS + ${WAIT_S:-540}))
  while [ ! -f /tmp/drafters.rc ] && [ $SECONDS -lt $end ]; do sleep 5; done
  [ -f /tmp/drafters-results/log.txt ] || { echo "no drafter run on this machine (given back?)"; exit 1; }
  grep -v '%|' /tmp/drafters-results/log.txt | tail -40 || true
  [ -f /tmp/drafters.rc ] || { echo "still running: call drafters-wait again"; exit 0; }
  echo "drafters exit $(cat /tmp/drafters.rc)"
  cp -r /tmp/drafters-results/. /tmp/drafters-sha.txt "$OUT"/
  # One archive: a call brings back only a few files, and a 2-layer drafter is over 16 MiB (deliver splits it).
  [ -d /tmp/drafters ] && tar -cf "$OUT/drafters.tar" -C /tmp/drafters .
  deliver ;;
*)
  echo "usage: $0 pack|smoke|have|train|resume|drafters|drafters-wait" >&2; exit 2 ;;
esac

