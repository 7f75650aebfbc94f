#!/usr/bin/env bash
# The test command: on a fresh Debian machine with ../shared beside the checkout, installs what is
# missing, checks the include order and the function lengths, builds, runs every C unit test (ctest,
# which also replays every fuzz target's committed corpus, tests/fuzz/) and the Python integration
# tests against the peers, then (BQ_SANITIZE_PASS=1, the default under CI) rebuilds with
# address+undefined sanitizers and runs the C unit tests and the corpus replay again.
source "$(dirname "$0")/setup_env.sh"
cd "$BQ_ROOT"
bq_install_debs
bq_install_venv
bq_get_model
if [ ! -d "$BERTQAT_DATA/imdb" ]; then
    echo "BERTQAT_DATA=$BERTQAT_DATA has no imdb/ (see ../shared/data/README.md)" >&2
    exit 1
fi

scripts/check_includes.sh
scripts/check_func_length.sh
echo "== build (Release)"
bq_build build
echo "== C tests"
(cd build && ctest --output-on-failure -j"$(nproc)")

echo "== Python integration tests"
export BQ_BUILD_DIR=$BQ_ROOT/build
# pytest's temporary files (checkpoints and ONNX models, several GB in all) go under build/, which
# --basetemp empties at the start of each run, instead of accumulating under /tmp; removed after a pass.
echo "disk free before the Python tests: $(df -h --output=avail build | tail -1 | tr -d ' ')"
"$BQ_PYTHON" -m pytest -q -ra --basetemp "$BQ_ROOT/build/pytest-tmp" tests/python | tee build/pytest.log
# under CI a skip is a failure (tests/python/conftest.py); this catches any that slipped through
if [ -n "${CI:-}" ] && grep -qE '^SKIPPED|[0-9]+ skipped' build/pytest.log; then echo "== tests skipped under CI" >&2; exit 1; fi

rm -rf "$BQ_ROOT/build/pytest-tmp"

if [ "${BQ_SANITIZE_PASS:-${CI:+1}}" = 1 ]; then
    echo "== build with sanitizers (address;undefined) and run the C tests"
    bq_build build-san "-DBQ_SANITIZE=address;undefined" -DCMAKE_BUILD_TYPE=RelWithDebInfo
    (cd build-san && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j"$(nproc)" -LE slow)
fi
echo "== all tests passed"
