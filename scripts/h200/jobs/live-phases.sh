#!/usr/bin/env bash
# Live switching on the H200 (docs/benchmarks.md, "Live switching" and "The
# controller under a changing load"), as one background job of device.sh:
#   JOB=scripts/h200/jobs/live-phases.sh SKIP_PREFLIGHT=1 scripts/h200/device.sh start
# 1. bench phases --one-server: 1 -> 8 -> 1 streams, every static config
#    pinned in turn on one live engine, then the controller.
# 2. bench live-switch: P-EAGLE K=5 on the live engine against an engine
#    built for it alone (what a pinned static costs), and switch latency
#    under load.
# 3. (AGAIN=1) the controller once more on a new server, started from the
#    profile the first run's controller saved (its measurements), against
#    the statics of step 1: a restart, not a cold start.
# CLOCK: whose clock times the requests (default server: random weights write
# text the server holds back, which the client's clock counts by config).
# PHASES_ARGS: more `bench phases` arguments (e.g. --configs p5,controller
# --rounds 2 --statics-from FILE); LIVE=0 skips step 2.
# Results land flat in $OUT_DIR (device.sh wait copies files, not folders).
set -uo pipefail
: "${CONFIG:?}" "${OUT_DIR:?}"
PHASE_S=${PHASE_S:-20}
CTL_WARMUP=${CTL_WARMUP:-45}
rc=0
python3 -P -m quickdraft bench phases --one-server --config "$CONFIG" --phase-seconds "$PHASE_S" --settle-seconds 10 \
    --controller-warmup "$CTL_WARMUP" --clock "${CLOCK:-server}" --out "$OUT_DIR/phases" --no-progress ${PHASES_ARGS:-} || rc=1
for f in phases.json phases.md phases.png; do cp "$OUT_DIR/phases/$f" "$OUT_DIR/h200-$f" 2>/dev/null; done
cp "$OUT_DIR/phases/logs/one-server.server.log" "$OUT_DIR/h200-phases-server.log" 2>/dev/null
if [ "${AGAIN:-0}" = 1 ]; then
    prof=$(ls -d "$OUT_DIR"/phases/controller-profile-* 2>/dev/null | head -1)
    python3 -P -m quickdraft bench phases --one-server --config "$CONFIG" --phase-seconds "$PHASE_S" --settle-seconds 10 \
        --controller-warmup "${AGAIN_WARMUP:-10}" --clock "${CLOCK:-server}" --configs controller --statics-from "$OUT_DIR/phases/phases.json" \
        --controller-profile-dir "$prof" --out "$OUT_DIR/phases-again" --no-progress ${AGAIN_ARGS:-} || rc=1
    for f in phases.json phases.md phases.png; do cp "$OUT_DIR/phases-again/$f" "$OUT_DIR/h200-again-$f" 2>/dev/null; done
fi
[ "${LIVE:-1}" = 0 ] && exit $rc
python3 -P -m quickdraft bench live-switch --config "$CONFIG" --configs "${LIVE_CONFIGS:-parallel K=5,autoregressive K=5,parallel K=3}" \
    --concurrency 1,8 --requests 16 --rounds ${LIVE_ROUNDS:-2} --switches ${SWITCHES:-300} --static "parallel K=5" \
    --json "$OUT_DIR/h200-live-switch.json" || rc=1
exit $rc
