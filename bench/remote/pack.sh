#!/usr/bin/env bash
# Packs what bench/remote/run.sh needs on a bare x86-64 machine without this project's Debian packages
# or network (such as the AMX Xeon of docs/results.md#inference-on-the-amx-xeon) into DIR: the bertqat binary (and, when given,
# a second one to compare), the shared libraries it loads except glibc's (xz-compressed), the IMDB
# tarball, all-MiniLM-L6-v2's config and tokenizer files with the names and shapes of its tensors (the
# weights themselves are generated there), and the scripts. About 57 MB.
#   bash bench/remote/pack.sh DIR BERTQAT [OLD_BERTQAT]
set -euo pipefail
out=$1 bin=$2 old=${3:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
model=$root/data/models/all-MiniLM-L6-v2
data=${BERTQAT_DATA:-$root/../shared/data}/imdb/aclImdb_train_test.tar.gz
mkdir -p "$out/model" "$out/lib.tmp"
cp "$bin" "$out/bertqat"
[ -n "$old" ] && cp "$old" "$out/bertqat-old"
ldd "$bin" | awk '$3 ~ /^\// {print $1, $3}' | grep -v -E '^(libc|libm|libpthread|libdl|librt|ld-linux)[.-]' |
    while read -r name path; do cp -L "$path" "$out/lib.tmp/$name"; done
(cd "$out/lib.tmp" && tar cf - . | xz -T0 -6 > ../libs.tar.xz)
rm -rf "$out/lib.tmp"
cp "$data" "$out/"
cp "$model"/{config.json,vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$out/model/"
python3 - "$model/model.safetensors" "$out/shapes.json" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
json.dump({k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in h.items() if k != "__metadata__"},
          open(sys.argv[2], "w"))
PY
cp "$root/bench/remote/random_minilm.py" "$root/bench/remote/run.sh" "$out/"
du -sh "$out"
