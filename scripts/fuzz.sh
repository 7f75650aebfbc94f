#!/usr/bin/env bash
# Coverage-guided fuzzing of the readers (tests/fuzz/fuzz_*.c) with clang's libFuzzer under
# AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   scripts/fuzz.sh [TARGET|all] [SECONDS]   fuzz one target (e.g. ckpt) or all, SECONDS each (600)
#   scripts/fuzz.sh --seeds                  rewrite the seed inputs tests/fuzz/corpus/*/seed-*
#   scripts/fuzz.sh --list                   list the targets
#
# The build goes to build-fuzz/ (clang, -DBQ_FUZZ=ON, -march=native: clang does not pass a function's
# target("avx2") attribute on to the OpenMP regions inside it, so the ISA is set for the whole build).
# Each target starts from its committed corpus tests/fuzz/corpus/<target> and writes what it finds to
# build-fuzz/corpus/<target> (new inputs) and build-fuzz/crashes/<target> (failing inputs: crash, leak,
# sanitizer report, over 1 s or 2 GB). With "all", BQ_FUZZ_PARALLEL targets (default: the number of cores) run at once, one core each.
# A failing input, once the parser is fixed, is committed as tests/fuzz/corpus/<target>/regress-<name>
# so that the replay tests (ctest fuzz_<target>_replay, run by scripts/test.sh) keep it fixed.
# The last lines print, per target: executions, executions per second, edges covered, failing inputs.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
TARGETS=$(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||' | sort)

if [ "${1:-}" = "--list" ]; then echo "$TARGETS"; exit 0; fi
if [ "${1:-}" = "--seeds" ]; then
    source scripts/setup_env.sh
    bq_build build
    build/fuzz_make_seeds
    exit 0
fi

WHICH=${1:-all}
SECS=${2:-600}
if [ "$WHICH" != all ] && ! grep -qx "$WHICH" <<<"$TARGETS"; then
    echo "fuzz.sh: unknown target '$WHICH' (one of: $(echo $TARGETS))" >&2
    exit 2
fi
for p in clang libclang-rt-14-dev libomp-dev; do
    if ! dpkg -s "$p" >/dev/null 2>&1; then
        if [ "$(id -u)" = 0 ]; then
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$p" >/dev/null
        else
            echo "fuzz.sh: install $p (sudo apt-get install $p)" >&2
            exit 1
        fi
    fi
done
source scripts/setup_env.sh
bq_install_debs
cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBQ_FUZZ=ON \
    "-DBQ_SANITIZE=address;undefined" -DBQ_MPI=OFF -DBQ_NATIVE=ON >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) >/dev/null

run_one() { # run_one TARGET SECONDS
    local t=$1 secs=$2 work=build-fuzz/corpus/$1 crashes=build-fuzz/crashes/$1 log=build-fuzz/log/$1.log leaks=1
    mkdir -p "$work" "$crashes" build-fuzz/log
    # The HDF5 readers: libhdf5 keeps caches between inputs, so a per-input leak check (a full heap scan
    # whenever an input's mallocs and frees differ) runs on nearly every input and cuts the rate ~10x.
    # They are fuzzed without it, then every input of their corpus is run once more with it (below).
    case $t in ckpt | train_state | tf_h5) leaks=0 ;; esac
    # -timeout: an input that takes over a second is a hang; -rss_limit_mb: a parser that allocates by
    # what a header claims. Leaks: see tests/fuzz/lsan.supp for the few that are HDF5's own.
    ASAN_OPTIONS=detect_leaks=$leaks:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 OMP_NUM_THREADS=1 \
        LSAN_OPTIONS=suppressions=$ROOT/tests/fuzz/lsan.supp \
        "build-fuzz/fuzz_$t" -max_total_time="$secs" -timeout=1 -rss_limit_mb=2048 -print_final_stats=1 \
        -detect_leaks=$leaks -artifact_prefix="$crashes/" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || true
    if [ $leaks = 0 ]; then
        # the leak pass: each corpus input once, full stacks through libhdf5 for the suppressions
        ASAN_OPTIONS=detect_leaks=1:fast_unwind_on_malloc=0 OMP_NUM_THREADS=1 \
            LSAN_OPTIONS=suppressions=$ROOT/tests/fuzz/lsan.supp \
            "build-fuzz/fuzz_$t" -runs=0 -timeout=30 -detect_leaks=1 -artifact_prefix="$crashes/" \
            "$work" "tests/fuzz/corpus/$t" >"$log.leaks" 2>&1 || true
        if grep -q 'ERROR: LeakSanitizer' "$log.leaks"; then echo "leak pass: see $log.leaks" >>"$log"; fi
    fi
    local runs rate cov found
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo '?')
    found=$(find "$crashes" -type f | wc -l)
    printf '%-16s %10s execs %8s exec/s %7s edges %3s failing inputs (log %s)\n' "$t" "$runs" "$rate" "$cov" "$found" "$log"
}
export -f run_one
export ROOT

echo "== fuzzing ($WHICH, ${SECS} s each) on $(lscpu | sed -n 's/^Model name: *//p' | head -1)"
if [ "$WHICH" = all ]; then
    printf '%s\n' $TARGETS | xargs -P "${BQ_FUZZ_PARALLEL:-$(nproc)}" -I{} bash -c "run_one {} $SECS" | tee build-fuzz/summary.txt
else
    run_one "$WHICH" "$SECS" | tee build-fuzz/summary.txt
fi
if awk '{ if ($8 + 0 > 0) bad = 1 } END { exit !bad }' build-fuzz/summary.txt; then
    echo "== failing inputs found: see build-fuzz/crashes/" >&2
    exit 1
fi
