#!/usr/bin/env bash
# Keeps the device machine's carry under its 64 MiB limit. The `run` tool sends the checkout's tracked files plus
# the carried paths; the tracked tree is ~64 MB, so a test binary pack no longer fits beside it. `on` takes the
# fixtures no device run reads (tests/fixtures/models/code-small, plus any paths named after `on` that the call at
# hand does not need) out of the index and ignores them for the call; `off` puts every one of them back. The files
# themselves never move. While any is out, a pre-commit hook (installed here, in the repository's shared hooks)
# refuses a commit that would record its deletion.
#   bash tools/device_slim.sh on [PATH...]   # before a `run` call
#   bash tools/device_slim.sh off            # right after it (idempotent)
#   bash tools/device_slim.sh status
set -euo pipefail
cd "$(dirname "$0")/.."
common=$(git rev-parse --git-common-dir)
exclude="$common/info/exclude"
list="$common/device_slim.list"  # the paths now out of the index, one per line
hook="$common/hooks/pre-commit"

install_hook() {
  mkdir -p "$common/hooks"
  [ -f "$hook" ] && grep -q "device_slim.list" "$hook" && return
  cat > "$hook" <<'HOOK'
#!/bin/sh
# Installed by tools/device_slim.sh: never record the deletion of files that were only taken out for a device run.
list="$(git rev-parse --git-common-dir)/device_slim.list"
[ -s "$list" ] || exit 0
deleted=$(git diff --cached --name-only --diff-filter=D)
while read -r p; do
  if printf '%s\n' "$deleted" | grep -q "^$p/"; then
    echo "pre-commit: this commit would delete $p (taken out for a device run)." >&2
    echo "pre-commit: run 'bash tools/device_slim.sh off' first." >&2
    exit 1
  fi
done < "$list"
HOOK
  chmod +x "$hook"
}

case "${1:-status}" in
  on)
    install_hook
    shift
    for p in tests/fixtures/models/code-small "$@"; do
      p=${p%/}
      [ -d "$p" ] || { echo "device_slim: $p is not a folder of the checkout" >&2; exit 2; }
      grep -qxF "$p" "$list" 2> /dev/null || printf '%s\n' "$p" >> "$list"
      if git ls-files --error-unmatch "$p" > /dev/null 2>&1; then git rm -r -q --cached "$p"; fi
      grep -qxF "/$p/" "$exclude" 2> /dev/null || printf '%s\n' "/$p/" >> "$exclude"
    done
    git ls-files -z | du -ck --files0-from=- 2> /dev/null | tail -1 |
      awk '{printf "device_slim: on, tracked tree %.1f MiB\n", $1/1024}'
    ;;
  off)
    if [ -s "$list" ]; then
      while read -r p; do
        git reset -q HEAD -- "$p"
        sed -i "\\#^/$p/\$#d" "$exclude"
      done < "$list"
      : > "$list"
    fi
    echo "device_slim: off"
    ;;
  status)
    if [ -s "$list" ]; then sed 's/$/: out of the index (on)/' "$list"; else echo "device_slim: off"; fi
    ;;
  *) echo "usage: $0 on [PATH...] | off | status" >&2; exit 2 ;;
esac
