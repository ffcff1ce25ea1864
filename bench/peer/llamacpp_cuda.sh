#!/usr/bin/env bash
# bench/peer/llamacpp_cuda.sh — llama.cpp CUDA as the GPU peer of gpu_bench. The npm prebuilt CUDA library does not
# run on the device machine (driver 580: "the provided PTX was compiled with an unsupported toolchain") and is too big
# to carry, so llama-bench is built from source there: node-llama-cpp@3.22.1 holds llama.cpp's source as a git bundle.
#
#   bench/peer/llamacpp_cuda.sh pack DIR   here: `npm pack` the package, clone the bundle, keep what llama-bench
#                                          needs (ggml CPU + CUDA, src, common, vendor without miniaudio,
#                                          tools/llama-bench) -> DIR/llama-src.tar.xz (~1.8 MB; carry DIR)
#   bench/peer/llamacpp_cuda.sh build DIR  on the device: unpack, cmake + ninja llama-bench (sm_90, static, no
#                                          curl/ssl/server/tests/examples) -> /tmp/llama-build/bin/llama-bench
#                                          (~5 min on its 16 cores; checked here only as far as cmake configure)
#   bench/peer/llamacpp_cuda.sh run GGUF... on the device: llama-bench -ngl 99 -fa 1 -p 180,1800 -n 128 -r 3, JSON
#                                          lines (prompt and generation tok/s; compare with gpu_bench's steady
#                                          figures: llama-bench warms up first)
# The GGUFs come from the same weights as tierlm's HF folder: synthetic_hf DIR --shape 1b, then gguf_export DIR
# OUT.gguf f16|q8_0|q4_0 (bench/peer.sh does the same for the CPU peer).
set -euo pipefail
case "${1:-}" in
  pack)
    out="$(mkdir -p "$2" && cd "$2" && pwd)"
    work="$(mktemp -d)"
    (cd "$work" && npm pack --silent node-llama-cpp@3.22.1 > /dev/null &&
       tar xzf node-llama-cpp-3.22.1.tgz package/llama/gitRelease.bundle &&
       git -c advice.detachedHead=false clone -q package/llama/gitRelease.bundle src)
    keep="$work/keep"
    mkdir -p "$keep/tools"
    (cd "$work/src" && cp -r CMakeLists.txt cmake common include src vendor ggml LICENSE "$keep/" &&
       cp -r tools/llama-bench "$keep/tools/")
    printf 'find_package(Threads REQUIRED)\nllama_add_compile_flags()\nadd_subdirectory(llama-bench)\n' \
      > "$keep/tools/CMakeLists.txt"
    rm -rf "$keep/vendor/miniaudio"
    sed -i '/miniaudio/d' "$keep/vendor/CMakeLists.txt"
    for b in cann openvino webgpu et metal hexagon sycl vulkan opencl virtgpu rpc zdnn blas musa hip zendnn; do
      rm -rf "$keep/ggml/src/ggml-$b"
    done
    tar -C "$keep" -cf - . | xz -T2 -9 > "$out/llama-src.tar.xz"
    rm -rf "$work"
    ls -la "$out/llama-src.tar.xz"
    ;;
  build)
    rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && tar -C /tmp/llama-src -xJf "$2/llama-src.tar.xz"
    cmake -S /tmp/llama-src -B /tmp/llama-build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF > /dev/null
    ninja -C /tmp/llama-build llama-bench > /tmp/llama-build.log 2>&1 || { tail -20 /tmp/llama-build.log; exit 1; }
    ;;
  run)
    shift
    for g in "$@"; do
      /tmp/llama-build/bin/llama-bench -m "$g" -ngl 99 -fa 1 -p 180,1800 -n 128 -r 3 -o jsonl
    done
    ;;
  *)
    echo "usage: $0 pack DIR | build DIR | run GGUF..." >&2
    exit 2
    ;;
esac
