#!/usr/bin/env bash
# Writes the seed corpus of fuzz_decompress (fuzz/corpus/decompress) with a built ckptool:
# archives of the test fixtures at both levels, an empty file, and a small folder with a
# symlink, an empty file and an empty folder.
#   fuzz/make_ckz_seeds.sh build/ckptool
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
ckptool="$(realpath "${1:-$here/../build/ckptool}")"
out="$here/corpus/decompress"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
for f in small.pt small_legacy.pt small.safetensors; do
  cp "$here/../tests/fixtures/$f" "$work/$f"
  for level in fast max; do
    "$ckptool" compress -q -f --level "$level" "$work/$f" -o "$out/seed-$f-$level.ckz"
  done
done
# Tensors large enough for Huffman-coded planes (safetensors: f32 and bf16 normal(0, 0.02)).
python3 - "$work/planes.safetensors" <<'PY'
import json, random, struct, sys
random.seed(1)
f32 = [random.gauss(0, 0.02) for _ in range(1500)]
raw32 = struct.pack("<1500f", *f32)
raw16 = b"".join(raw32[4 * i + 2:4 * i + 4] for i in range(1500))
h = json.dumps({"a": {"dtype": "F32", "shape": [1500], "data_offsets": [0, 6000]},
                "b": {"dtype": "BF16", "shape": [1500], "data_offsets": [6000, 9000]}}).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + raw32 + raw16)
PY
"$ckptool" compress -q -f "$work/planes.safetensors" -o "$out/seed-planes.ckz"
: > "$work/empty"
"$ckptool" compress -q -f "$work/empty" -o "$out/seed-empty.ckz"
mkdir -p "$work/folder/sub" "$work/folder/empty_dir"
cp "$here/../tests/fixtures/small.pt" "$work/folder/model.pt"
echo '{"hidden": 8}' > "$work/folder/config.json"
: > "$work/folder/sub/empty"
ln -s model.pt "$work/folder/latest"
touch -d @1600000000 "$work/folder" "$work/folder"/* "$work/folder/sub"/*
"$ckptool" compress -q -f "$work/folder" -o "$out/seed-folder.ckz"
