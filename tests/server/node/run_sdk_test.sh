#!/usr/bin/env bash
# CTest entry: the openai SDK test, skipped (exit 77, reason printed) when node or the installed SDK is missing.
# Install the SDK with: (cd tests/server/node && npm ci)   — tools/setup.sh does it.
here="$(cd "$(dirname "$0")" && pwd)"
command -v node >/dev/null 2>&1 || { echo "SKIP: node is not installed"; exit 77; }
[ -f "$here/node_modules/openai/package.json" ] || { echo "SKIP: openai SDK not installed (cd tests/server/node && npm ci)"; exit 77; }
exec node "$here/sdk_test.mjs"
