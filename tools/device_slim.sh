#!/usr/bin/env bash
# Keeps the device machine's carry under its 64 MiB limit. The `run` tool sends the checkout's tracked files plus
# the carried paths; the tracked tree is ~64 MB, so a test binary pack no longer fits beside it. `on` takes the
# fixtures no device run reads (SLIM_PATHS) out of the index and ignores them for the call; `off` puts them back.
# The files themselves never move. While `on`, a pre-commit hook (installed here, in the repository's shared hooks)
# refuses any commit that would record their deletion.
#   bash tools/device_slim.sh on     # before a `run` call
#   bash tools/device_slim.sh off    # right after it (idempotent; `status` says which state the index is in)
set -euo pipefail
cd "$(dirname "$0")/.."
# No GPU test or device bench reads these (gpu_forward_test uses profiles/models/tierlm-tiny, which stays).
SLIM_PATHS=(tests/fixtures/models/code-small)
common=$(git rev-parse --git-common-dir)
exclude="$common/info/exclude"
hook="$common/hooks/pre-commit"

install_hook() {
  mkdir -p "$common/hooks"
  [ -f "$hook" ] && grep -q "device_slim" "$hook" && return
  cat > "$hook" <<'EOF'
#!/bin/sh
# Installed by tools/device_slim.sh: never record the deletion of fixtures that were only taken out for a device run.
if git diff --cached --name-only --diff-filter=D | grep -q '^tests/fixtures/models/code-small/'; then
  echo "pre-commit: this commit would delete tests/fixtures/models/code-small (taken out for a device run)." >&2
  echo "pre-commit: run 'bash tools/device_slim.sh off' first." >&2
  exit 1
fi
EOF
  chmod +x "$hook"
}

case "${1:-status}" in
  on)
    install_hook
    for p in "${SLIM_PATHS[@]}"; do
      if git ls-files --error-unmatch "$p" > /dev/null 2>&1; then git rm -r -q --cached "$p"; fi
      grep -qxF "/$p/" "$exclude" 2> /dev/null || printf '%s\n' "/$p/" >> "$exclude"
    done
    git ls-files -z | du -ck --files0-from=- 2> /dev/null | tail -1 | awk '{printf "device_slim: on, tracked tree %.1f MiB\n", $1/1024}'
    ;;
  off)
    for p in "${SLIM_PATHS[@]}"; do
      git reset -q HEAD -- "$p"
      sed -i "\\#^/$p/\$#d" "$exclude"
    done
    echo "device_slim: off"
    ;;
  status)
    for p in "${SLIM_PATHS[@]}"; do
      if git diff --cached --quiet -- "$p"; then echo "$p: tracked"; else echo "$p: out of the index (on)"; fi
    done
    ;;
  *) echo "usage: $0 on|off|status" >&2; exit 2 ;;
esac
