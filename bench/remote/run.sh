#!/usr/bin/env bash
# Runs on the borrowed machine from the folder pack.sh made: unpacks bq.tar.xz into $WORK (default
# /tmp/bq) and runs the named stages in order, each printing as it goes and writing STAGE.txt under $OUT
# (default /tmp/out). Needs glibc 2.36 or later, lscpu, taskset and $PYTHON (default python3) with numpy
# for the random model and onnxruntime for int8 (torch for the PyTorch rows of train and train-minilm:
# $TORCH_PYTHON, default $PYTHON).
#   bash DIR/run.sh [STAGE...]        (default: info tests int8 train)
# Stages:
#   info          lscpu, the CPU's ISA flags, bertqat --version, the Python packages (always run first)
#   tests         the bf16 and integer hardware tests ($HW_TESTS below) with their output, then every
#                 other test_* binary (a log per failure)
#   train         bench/bench_train.py on the BERT-base shape at $THREADS threads (default: all CPUs),
#                 $STEPS timed steps (default 2) after one warm-up, PyTorch as the peer
#   train-minilm  the same on all-MiniLM-L6-v2's shapes (random weights) at $THREADS threads, then pinned
#                 to two physical cores with --threads 2
#   int8          a `cpu`-scheme PTQ of the random MiniLM (64 calibration reviews), its export, and
#                 `bertqat bench` of fp32, fake quant, the int8 engine and ONNX Runtime at batch 1 and 32,
#                 seq 128: at $THREADS threads (10 rounds), then pinned to two physical cores (6 rounds) and
#                 to one (4 rounds); then the same for `ort`- and `qdqbert`-scheme PTQs and their CPU-layout
#                 exports, bench_int8's time by section and its sweep of the fused layers' block size (at
#                 $THREADS threads and on two pinned cores), bench_qgemm's GEMM rate by block rows (the
#                 same two ways), bench_passes's passes between the GEMMs and bench_peak's instruction
#                 peaks (the units' rate) on one pinned core
#   int8-base     the same on a random BERT-base-shaped model (bench/make_random_bert.py): a `cpu` PTQ (16
#                 calibration reviews), its export, `bertqat bench` at $THREADS threads (5 rounds) and on two
#                 pinned cores (3 rounds), and the peak resident set of `eval` of its fp32 checkpoint (one
#                 finetune step) and of the PTQ on the int8 engine (64 reviews, 2 threads, batch 1, 8 and 64),
#                 and their ratio
#   eval          on two pinned physical cores: `ort` and `cpu` PTQs of the random MiniLM, then eval of
#                 the fp32 model and both PTQs on 512 test reviews (and again with bertqat-old, if packed)
#   sens          on two pinned physical cores: sensitivity of the `ort` PTQ on $SENS_ORT examples (64)
#                 and of the `cpu` PTQ on $SENS_CPU examples (512); needs the eval stage's PTQs
# The float rows of bench, eval and sensitivity run in $PRECISION (default fp32, the precision of the
# figures in docs/results.md; auto is bf16 on a CPU with bf16 units); $ROUNDS overrides int8's rounds.
set -u
here=$(cd "$(dirname "$0")" && pwd)
W=${WORK:-/tmp/bq} OUT=${OUT:-/tmp/out}
PYTHON=${PYTHON:-python3} THREADS=${THREADS:-$(nproc)} STEPS=${STEPS:-2} PRECISION=${PRECISION:-fp32}
TORCH_PYTHON=${TORCH_PYTHON:-$PYTHON}
stages=${*:-"tests int8 train"}
for s in $stages; do
    case $s in info|tests|train|train-minilm|int8|int8-base|eval|sens) ;;
    *) echo "run.sh: unknown stage '$s' (info, tests, train, train-minilm, int8, int8-base, eval, sens)" >&2; exit 2 ;; esac
done
mkdir -p "$W" "$OUT"
if [ ! -x "$W/bin/bertqat" ] || [ "$here/bq.tar.xz" -nt "$W/bin/bertqat" ]; then
    tar xJf "$here/bq.tar.xz" -C "$W" || { echo "run.sh: cannot unpack $here/bq.tar.xz into $W" >&2; exit 1; }
    touch "$W/bin/bertqat"
fi
B=$W/bin D=$W/data/imdb/aclImdb_train_test.tar.gz
export BERTQAT_DATA=$W/data PYTHONUNBUFFERED=1
# the first two physical cores, for the pinned runs
CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -2 | cut -d, -f1 | paste -sd,)
T2="taskset -c $CPUS" T1="taskset -c ${CPUS%%,*}"
t0=$(date +%s)
say() { echo "[run.sh $(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/progress.txt"; }
model() {  # the random-weight MiniLM, made once
    [ -e "$W/model/model.safetensors" ] || "$PYTHON" "$W/src/bench/remote/random_minilm.py" "$W/model/shapes.json" "$W/model"
}

info() {
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|L2|L3|family|Model:"
    echo "ISA: $(grep -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16|avx_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"
    "$B/bertqat" --version
    "$PYTHON" -c "import sys; print('python', sys.version.split()[0])"
    for p in numpy onnxruntime; do "$PYTHON" -c "import $p; print('$p', $p.__version__)" 2>/dev/null || echo "$p: not installed"; done
    "$TORCH_PYTHON" -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "torch ($TORCH_PYTHON): not installed"
}

# the tests whose bf16 and integer paths differ on a CPU with bf16 units, VNNI or AMX: output printed
HW_TESTS="test_gemm_bf16 test_bf16_step test_bf16_storage test_fp32_forward test_resume test_precision test_int8_forward"
tests() {  # from src/, as ctest runs them (some read tests/fixtures relative to the working folder)
    local logs=$OUT/test-logs n rc fails=0
    mkdir -p "$logs"
    cd "$W/src" || return 1
    export BQ_SOURCE_DIR=$W/src BQ_BUILD_DIR=$B
    for n in $HW_TESTS; do
        timeout 300 "$B/$n" > "$logs/$n.log" 2>&1
        rc=$?
        echo "== $n rc=$rc"; cat "$logs/$n.log"
        [ $rc = 0 ] || fails=$((fails + 1))
    done
    ls "$B" | grep '^test_' | grep -v -x -E "$(echo $HW_TESTS | tr ' ' '|')" |
        xargs -P "$THREADS" -I{} sh -c 'timeout 300 "$1/$2" > "$3/$2.log" 2>&1; echo "$2 rc=$?"' _ "$B" {} "$logs" |
        sort > "$OUT/tests-rc.txt"
    grep -v ' rc=0$' "$OUT/tests-rc.txt" | while read -r n rc; do echo "== $n $rc"; tail -20 "$logs/$n.log"; done
    echo "other tests: $(grep -c ' rc=0$' "$OUT/tests-rc.txt") passed, $(grep -vc ' rc=0$' "$OUT/tests-rc.txt") failed"
    unset BQ_SOURCE_DIR BQ_BUILD_DIR
    cd - > /dev/null
    [ $fails = 0 ] && ! grep -q -v ' rc=0$' "$OUT/tests-rc.txt"
}

has_torch() {
    "$TORCH_PYTHON" -c "import torch" 2>/dev/null || { echo "$TORCH_PYTHON has no torch (set TORCH_PYTHON)"; return 1; }
}

bench_train() {  # bench/bench_train.py against PyTorch, without its eager QAT row; the rest from "$@"
    "$PYTHON" "$W/src/bench/bench_train.py" --build "$B" --torch-python "$TORCH_PYTHON" --steps "$STEPS" \
        --skip-torch-qat "$@"
}

train() {
    has_torch || return 1
    bench_train --threads "$THREADS" --skip-minilm
}

train_minilm() {
    has_torch && model || return 1
    bench_train --minilm "$W/model" --threads "$THREADS" --skip-base
    (taskset -p -c "$CPUS" "$BASHPID" > /dev/null && bench_train --minilm "$W/model" --threads 2 --skip-base)
}

int8() {
    model
    local P=$W/ptq-int8
    "$B/bertqat" calibrate --model "$W/model" --data "$D" --out "$P" --scheme cpu --calib-samples 64 \
        --threads "$THREADS" 2>&1 | tail -1
    "$B/bertqat" export --model "$P" --out "$P.onnx" 2>&1 | tail -1
    "$B/bertqat" bench --model "$P" --onnx "$P.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-10}" \
        --threads "$THREADS" --python "$PYTHON" --precision "$PRECISION"
    $T2 "$B/bertqat" bench --model "$P" --onnx "$P.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-6}" \
        --threads 2 --python "$PYTHON" --precision "$PRECISION"
    $T1 "$B/bertqat" bench --model "$P" --onnx "$P.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-4}" \
        --threads 1 --python "$PYTHON" --precision "$PRECISION"
    # the ort and qdqbert schemes' PTQs (their layers fused on the engine, their 8-bit weights on oneDNN
    # where VNNI or AMX) against ONNX Runtime on their CPU-layout exports
    local s
    for s in ort qdqbert; do
        "$B/bertqat" calibrate --model "$W/model" --data "$D" --out "$P-$s" --scheme $s --calib-samples 64 \
            --threads "$THREADS" 2>&1 | tail -1
        "$B/bertqat" export --model "$P-$s" --out "$P-$s.onnx" --cpu-layout 2>&1 | tail -1
        "$B/bertqat" bench --model "$P-$s" --onnx "$P-$s.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-10}" \
            --threads "$THREADS" --python "$PYTHON" --precision "$PRECISION"
        $T2 "$B/bertqat" bench --model "$P-$s" --onnx "$P-$s.onnx" --batch-sizes 1,32 --seq 128 \
            --rounds "${ROUNDS:-5}" --threads 2 --python "$PYTHON" --precision "$PRECISION"
        $T1 "$B/bertqat" bench --model "$P-$s" --onnx "$P-$s.onnx" --batch-sizes 1,32 --seq 128 \
            --rounds "${ROUNDS:-4}" --threads 1 --python "$PYTHON" --precision "$PRECISION"
    done
    # the engine's time by section, and by block size of its fused layers (BQ_FUSED_BLOCK_ROWS)
    BQ_THREADS=$THREADS "$B/bench_int8" "$W/model"
    BQ_THREADS=2 $T2 "$B/bench_int8" "$W/model"
    BQ_THREADS=$THREADS BQ_SWEEP_ROWS=7 "$B/bench_int8" "$W/model" | tail -1
    BQ_THREADS=2 BQ_SWEEP_ROWS=5 $T2 "$B/bench_int8" "$W/model" | tail -1
    BQ_THREADS=$THREADS "$B/bench_qgemm"
    BQ_THREADS=2 $T2 "$B/bench_qgemm"
    BQ_THREADS=1 $T1 "$B/bench_passes" 200
    $T1 "$B/bench_peak"
}

peak_rss() {  # peak_rss CMD...: runs CMD quietly and prints its peak resident set in MiB
    "$PYTHON" -c 'import resource, subprocess, sys
r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
print("rc %d, peak %.0f MiB" % (r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024), r.stderr.strip()[-200:] if r.returncode else "")' "$@"
}

int8_base() {
    local M=$W/base P=$W/base-ptq b
    [ -e "$M/model.safetensors" ] ||
        "$PYTHON" "$W/src/bench/make_random_bert.py" --out "$M" --tokenizer "$W/model" || return 1
    "$B/bertqat" calibrate --model "$M" --data "$D" --out "$P" --scheme cpu --calib-samples 16 --threads "$THREADS" 2>&1 |
        tail -1
    "$B/bertqat" export --model "$P" --out "$P.onnx" 2>&1 | tail -1
    "$B/bertqat" bench --model "$P" --onnx "$P.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-5}" \
        --threads "$THREADS" --python "$PYTHON" --precision "$PRECISION"
    $T2 "$B/bertqat" bench --model "$P" --onnx "$P.onnx" --batch-sizes 1,32 --seq 128 --rounds "${ROUNDS:-3}" \
        --threads 2 --python "$PYTHON" --precision "$PRECISION"
    "$B/bertqat" finetune --model "$M" --data "$D" --out "$M-fp32" --max-steps 1 --train-samples 64 --batch-size 8 \
        --max-seq-len 128 --threads "$THREADS" --evals-per-epoch 0 2>&1 | tail -1
    local f i
    for b in 1 8 64; do
        f=$(peak_rss $T2 "$B/bertqat" eval --model "$M-fp32" --data "$D" --samples 64 --max-seq-len 128 --threads 2 \
            --batch-size $b --precision "$PRECISION")
        i=$(peak_rss $T2 "$B/bertqat" eval --model "$P" --data "$D" --samples 64 --max-seq-len 128 --threads 2 \
            --batch-size $b --engine int8)
        echo "eval peak RSS, batch $b, fp32 checkpoint, fp32 engine: $f"
        echo "eval peak RSS, batch $b, cpu PTQ, int8 engine: $i"
        f=${f#*peak } i=${i#*peak }
        echo "eval peak RSS, batch $b: int8 / fp32 = $(awk -v a="${i%% *}" -v b="${f%% *}" 'BEGIN { printf "%.2f", a / b }')"
    done
}

eval_() {
    model
    local vs=new v m
    [ -x "$B/bertqat-old" ] && vs="old new"
    $T2 "$B/bertqat" calibrate --model "$W/model" --data "$D" --out "$W/ptq-ort" --scheme ort --calibrator percentile \
        --percentile 99.99 --calib-samples 128 --threads 2 2>&1 | tail -1
    $T2 "$B/bertqat" calibrate --model "$W/model" --data "$D" --out "$W/ptq-cpu" --scheme cpu --calib-samples 128 \
        --threads 2 2>&1 | tail -1
    for m in "$W/model" "$W/ptq-ort" "$W/ptq-cpu"; do for v in $vs; do
        local exe=$B/bertqat
        [ "$v" = old ] && exe=$B/bertqat-old
        $T2 "$exe" eval --model "$m" --data "$D" --samples 512 --threads 2 --precision "$PRECISION" --json 2>/dev/null |
            "$PYTHON" -c "import json,sys; d=json.load(sys.stdin); print('eval $v $m:', d['engine'], round(d['examples_per_s'], 1), 'reviews/s, accuracy', d['accuracy'])"
    done; done
}

sens() {
    local s
    for m in ort cpu; do
        local n=${SENS_ORT:-64}
        [ $m = cpu ] && n=${SENS_CPU:-512}
        [ -d "$W/ptq-$m" ] || { echo "sens: $W/ptq-$m is missing (run the eval stage first)"; return 1; }
        s=$(date +%s)
        $T2 "$B/bertqat" sensitivity --model "$W/ptq-$m" --data "$D" --samples "$n" --threads 2 \
            --precision "$PRECISION" --out "$OUT/sens-$m" > "$OUT/sens-$m.log" 2>&1
        echo "sensitivity $m, $n examples: rc $?, $(( $(date +%s) - s )) s"
    done
}

list=info status=0
for s in $stages; do [ "$s" = info ] || list="$list $s"; done
for s in $list; do
    say "$s: start"
    case $s in
    info) info ;; tests) tests ;; train) train ;; train-minilm) train_minilm ;; int8) int8 ;; int8-base) int8_base ;;
    eval) eval_ ;; sens) sens ;;
    esac 2>&1 | tee "$OUT/$s.txt"
    rc=${PIPESTATUS[0]}
    say "$s: done (exit $rc)"
    [ "$rc" = 0 ] || status=1
done
exit $status
