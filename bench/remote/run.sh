#!/usr/bin/env bash
# Runs on the remote machine from the folder pack.sh made (results under $OUT, default /tmp/out): the CPU
# and its ISA flags, then on two physical cores (taskset, --threads 2) eval of the fp32 model and of
# `ort` and `cpu` PTQs (512 test reviews), sensitivity of the `ort` PTQ on SENS_ORT examples (64) and of
# the `cpu` PTQ on SENS_CPU examples (512), and, where bertqat-old was packed, the evals and the `ort`
# sensitivity again with it for a before/after ratio on the same CPU.
set -u
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /tmp/lib && tar xJf libs.tar.xz -C /tmp/lib
export LD_LIBRARY_PATH=/tmp/lib
lscpu > "$OUT/lscpu.txt"
grep -E "Model name|^CPU\(s\)|Thread|L2|L3" "$OUT/lscpu.txt"
grep -o -w -E "avx512f|avx512_vnni|avx512_bf16|amx_int8|amx_bf16|avx_vnni" /proc/cpuinfo | sort -u | tr '\n' ' '; echo
CPUS=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -u | head -2 | cut -d, -f1 | paste -sd,)
python3 random_minilm.py shapes.json model || exit 1
D=$PWD/aclImdb_train_test.tar.gz T="taskset -c $CPUS"
vs=new; [ -x bertqat-old ] && vs="old new"
bin() { if [ "$1" = old ]; then echo "$PWD/bertqat-old"; else echo "$PWD/bertqat"; fi; }
"$(bin new)" --version 2>&1
$T "$(bin new)" calibrate --model model --data "$D" --out /tmp/ptq-ort --scheme ort --calibrator percentile \
    --percentile 99.99 --calib-samples 128 --threads 2 2>&1 | tail -1
$T "$(bin new)" calibrate --model model --data "$D" --out /tmp/ptq-cpu --scheme cpu --calib-samples 128 --threads 2 2>&1 | tail -1
for m in model /tmp/ptq-ort /tmp/ptq-cpu; do for v in $vs; do
    $T "$(bin $v)" eval --model $m --data "$D" --samples 512 --threads 2 --json 2>/dev/null | python3 -c \
        "import json,sys; d=json.load(sys.stdin); print('eval $v $m', d['engine'], round(d['examples_per_s'],1), 'reviews/s, accuracy', d['accuracy'])"
done; done
for v in $vs; do
    s=$(date +%s)
    $T "$(bin $v)" sensitivity --model /tmp/ptq-ort --data "$D" --samples "${SENS_ORT:-64}" --threads 2 --out /tmp/sens-ort-$v >/dev/null 2>&1
    echo "sensitivity ort ${SENS_ORT:-64} examples, $v: rc $?, $(( $(date +%s) - s )) s"
done
s=$(date +%s)
$T "$(bin new)" sensitivity --model /tmp/ptq-cpu --data "$D" --samples "${SENS_CPU:-512}" --threads 2 --out "$OUT/sens-cpu" > "$OUT/sens-cpu.log" 2>&1
echo "sensitivity cpu ${SENS_CPU:-512} examples: rc $?, $(( $(date +%s) - s )) s"
