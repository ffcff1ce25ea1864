#!/usr/bin/env bash
# CTest entry: the @anthropic-ai/sdk test, skipped (exit 77, reason printed) when node or the SDK is missing.
# Install the SDKs with: (cd tests/server/node && npm ci)   — tools/setup.sh does it.
here="$(cd "$(dirname "$0")" && pwd)"
command -v node >/dev/null 2>&1 || { echo "SKIP: node is not installed"; exit 77; }
[ -f "$here/node_modules/@anthropic-ai/sdk/package.json" ] ||
  { echo "SKIP: @anthropic-ai/sdk not installed (cd tests/server/node && npm ci)"; exit 77; }
exec node "$here/anthropic_sdk_test.mjs"
