#!/usr/bin/env bash
# Installs every system package tierlm needs on Debian 12 (bookworm). Idempotent; run as root or with sudo.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
PKGS=(g++ cmake make pkg-config git
      libboost1.81-dev libboost-json1.81-dev
      libspdlog-dev libfmt-dev libopenblas-dev libhwloc-dev libnuma-dev liburing-dev libcli11-dev
      libonig-dev libicu-dev libgtest-dev libgmock-dev libbenchmark-dev
      libcurl4-openssl-dev libssl-dev  # the hub client (tierlm pull, --model ORG/NAME)
      python3 python3-jinja2 python3-jsonschema ccache  # jsonschema: the oracle of structured-output tests
      chromium wrk  # server tests: the dashboard in headless Chromium (~20 s to install), the wrk load test
      clang libclang-rt-14-dev llvm)  # fuzzing: clang 14 with libFuzzer and the sanitizer runtimes, llvm-symbolizer
# Node.js/npm are only needed for fetching the npm tokenizer packages and the openai SDK tests.
command -v npm >/dev/null 2>&1 || PKGS+=(nodejs npm)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tierlm setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "tierlm setup: all system packages present"
fi
# The openai and Anthropic SDKs and the Vercel AI SDK for the server's real-client tests, pinned by
# tests/server/node/package-lock.json.
if command -v npm >/dev/null 2>&1 && { [ ! -d "$(dirname "$0")/../tests/server/node/node_modules/openai" ] ||
                                      [ ! -d "$(dirname "$0")/../tests/server/node/node_modules/@anthropic-ai/sdk" ] ||
                                      [ ! -d "$(dirname "$0")/../tests/server/node/node_modules/ai" ]; }; then
  (cd "$(dirname "$0")/../tests/server/node" && npm ci --no-audit --no-fund --silent) ||
    echo "tierlm setup: npm ci failed; the openai SDK test will be skipped"
fi
# The @huggingface/hub client for the loopback hub tests, pinned by tests/runtime/hub/node/package-lock.json.
if command -v npm >/dev/null 2>&1 && [ ! -d "$(dirname "$0")/../tests/runtime/hub/node/node_modules/@huggingface/hub" ]; then
  (cd "$(dirname "$0")/../tests/runtime/hub/node" && npm ci --no-audit --no-fund --silent) ||
    echo "tierlm setup: npm ci failed; the @huggingface/hub client tests will be skipped"
fi
