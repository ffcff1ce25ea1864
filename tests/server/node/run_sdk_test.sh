#!/usr/bin/env bash
# CTest entry: an npm client test (sdk_test.mjs, or the script named by $1) that needs the npm package $2 (openai by
# default), skipped (exit 77, reason printed) when node or the package is missing.
# Install the packages with: (cd tests/server/node && npm ci)   — tools/setup.sh does it.
here="$(cd "$(dirname "$0")" && pwd)"
package="${2:-openai}"
command -v node >/dev/null 2>&1 || { echo "SKIP: node is not installed"; exit 77; }
[ -f "$here/node_modules/$package/package.json" ] || { echo "SKIP: npm package $package not installed (cd tests/server/node && npm ci)"; exit 77; }
exec node "$here/${1:-sdk_test.mjs}"
