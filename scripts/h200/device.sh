#!/usr/bin/env bash
# Runs ON the lent H200, through the `run` tool, from the repository root.
# docs/gpu-h200.md has the whole procedure; in short:
#
#   scripts/h200/device.sh stash          # each call that carries .gpu/partN
#   scripts/h200/device.sh start ARGS...  # last part: unpack, then start
#                                         # `quickdraft tune ARGS` in the background
#                                         # (ENTRY=quickdraft.bench.grpc_overhead: that
#                                         # benchmark instead, with the same --config;
#                                         # JOB=scripts/h200/jobs/X.sh: that job script)
#   scripts/h200/device.sh wait SECONDS   # later calls: wait for it, copy results to $OUT
#
# The tune run outlives one call (a call lasts 10 minutes at most) because it
# is started in its own session; the machine stays held while calls follow
# each other within its 30 s idle window.
set -uo pipefail
PARTS=/tmp/qd-parts
SITE=/tmp/qd-site
PKG=/tmp/qd-pkg
RUN=/tmp/qd-run
CONFIG=${CONFIG:-bench/gpu/h200-qwen3-coder-dummy.toml}
ENTRY=${ENTRY:-quickdraft tune}
mkdir -p "$PARTS" "$RUN"
for d in .gpu/part*; do [ -d "$d" ] && cp "$d"/part* "$PARTS/"; done
# Keep NVLink multicast off (the machine's rule), also for spawned workers.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Nothing outside the machine can be reached: never wait on the hub.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
# FlashInfer is not carried (its wheels are large); vLLM's own top-k/top-p sampler is used.
export VLLM_USE_FLASHINFER_SAMPLER=0

unpack() {
    [ -f "$SITE/.done" ] && return 0
    local want=${SHA256:-}
    local got
    got=$(cat "$PARTS"/part* | sha256sum | cut -d' ' -f1)
    echo "parts: $(ls "$PARTS" | tr '\n' ' ') sha256 $got"
    if [ -n "$want" ] && [ "$want" != "$got" ]; then echo "checksum mismatch: want $want" >&2; exit 2; fi
    rm -rf "$SITE" && mkdir -p "$SITE"
    cat "$PARTS"/part* | xz -dc -T0 | tar -x -C "$SITE" || exit 3
    touch "$SITE/.done"
}

# quickdraft as its installed layout (pyproject maps the top-level folders into
# the package), from this call's checkout: every start, so an edit made between
# two starts on a warm machine is what runs. Run with python -P so the
# checkout's partial quickdraft/ does not shadow it.
install_package() {
    rm -rf "$PKG" && mkdir -p "$PKG/quickdraft"
    cp -r quickdraft/. "$PKG/quickdraft/"
    for sub in server client lsp_bridge bench; do cp -r "$sub" "$PKG/quickdraft/$sub"; done
    # The entry points pyproject.toml declares: vLLM finds its plugins (live
    # switching, server/vllm_live.py) through the package's metadata.
    local info="$PKG/quickdraft-0.1.0.dist-info"
    mkdir -p "$info"
    printf 'Metadata-Version: 2.1\nName: quickdraft\nVersion: 0.1.0\n' > "$info/METADATA"
    printf '[vllm.general_plugins]\nquickdraft_live = quickdraft.server.vllm_live:register\n' > "$info/entry_points.txt"
}

case "${1:-stash}" in
stash)
    ls -la "$PARTS"
    ;;
start)
    shift
    unpack
    install_package
    # PYTHONSAFEPATH: python -P for spawned Python processes too (benchmark clients).
    export PYTHONPATH="$PKG:$SITE" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1 VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING}
    python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, torch.cuda.get_device_name(0))" || exit 4
    pkill -f "python3 -P -m $ENTRY" && sleep 5  # not "$ENTRY" alone: it matches this call's own command line
    [ -n "${SKIP_PREFLIGHT:-}" ] || python3 -P scripts/h200/preflight.py "$CONFIG" || exit 5
    rm -rf "$RUN"/done "$RUN"/rc "$RUN"/out && mkdir -p "$RUN"/out
    if [ -n "${JOB:-}" ]; then
        # A committed job script (scripts/h200/jobs/): several runs in one go, results into $OUT_DIR.
        job="CONFIG=$CONFIG OUT_DIR=$RUN/out bash $JOB"
    else
        # Quote each argument again for the inner shell ("--configs 'parallel K=5,...'" has spaces).
        printf -v args ' %q' "$@"
        job="python3 -P -m $ENTRY --config $CONFIG$args"
    fi
    pkill -f "bash scripts/h200/jobs/" && sleep 5
    setsid bash -c "$job > $RUN/log 2>&1; echo \$? > $RUN/rc; touch $RUN/done" < /dev/null &
    sleep "${WAIT_FIRST:-60}"
    tail -c 4000 "$RUN/log"
    ;;
wait)
    limit=${2:-540}
    t=0
    # A machine given back between calls comes back bare: say so at once
    # instead of sleeping out the call on device time (lost 580 s once).
    if [ ! -f "$RUN/log" ]; then echo "no tune run on this machine (it was given back and started fresh): stash the parts and start again" >&2; exit 6; fi
    while [ ! -f "$RUN/done" ] && [ "$t" -lt "$limit" ]; do sleep 5; t=$((t + 5)); done
    tail -c 6000 "$RUN/log"
    cp "$RUN"/log "$OUT"/tune.log 2>/dev/null
    if [ -f "$RUN/done" ]; then
        echo "tune exit $(cat "$RUN/rc")"
        cp "$RUN"/out/* "$OUT"/ 2>/dev/null
    else
        echo "still running"
    fi
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
    ;;
esac
