#!/usr/bin/env bash
# The GPU check of fedhead, one command on the lent GPU machine (H200, Python 3.12, torch; no
# package registry). Prepare here first (wheels, Hopper cache, certificates):
#
#   bash scripts/gpu_prepare.sh
#   device tool: run(command="bash scripts/gpu_check.sh", carry=[".whl", ".gpu-data"], timeout_s=600)
#
# On the GPU it installs the carried wheels into /tmp/site, then runs scripts/gpucheck/run_all.py:
#   train        paper-scale local training through fedhead.train.train_local on CUDA (Hopper
#                ResMLP width 1024, P = 512, 1,000 samples, batch 256, E = 4000, with and without
#                local_tol; dSprites ResNet-18, 1,500 samples, one round)
#   concurrency  several clients at once on the one GPU: K processes vs K CUDA streams
#   deploy       SuperLink + 4 SuperNodes on loopback with TLS, `flwr run .`, ClientApps on CUDA,
#                2 rounds at paper width (no Ray: its wheel alone exceeds the 64 MiB carry limit)
# while nvidia-smi samples GPU busy % and memory, and prints one table (seconds per client-round,
# clients per GPU, GPU busy %, GPU-hours of the `main` sweep grid at paper scale). Results go to
# $OUT (the device tool's folder) or results/gpu-check-*; each step has its own timeout and the
# whole check keeps to 450 s of steps (under 8 minutes with the install).
#
#   bash scripts/gpu_check.sh --cpu-dry-run [run_all.py options]
#
# runs the same steps on the CPU with tiny sizes, from a copy laid out as it travels (the repo's
# tracked and untracked-not-ignored files, .whl/, .gpu-data/) in a temporary folder. The dry run
# uses THIS machine's Python and its installed flwr/hydra/torch (the carried wheels are for
# Python 3.12): it checks the wheels instead (one version each, every need met there, and that
# pip accepts them for CPython 3.12 on x86-64) without importing them.
# Never run on a GPU so far: see README, "GPU check".
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}
DRY=0
INPLACE=0
ARGS=()
for a in "$@"; do
  case $a in
    --cpu-dry-run) DRY=1 ;;
    --in-place) INPLACE=1 ;;  # internal: already in the travelling layout
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) ARGS+=("$a") ;;
  esac
done
export PYTHONUNBUFFERED=1 FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

for need in .whl/flwr-1.42.0-py3-none-any.whl .gpu-data/cache .gpu-data/certs/ca.crt; do
  if [[ ! -e $need ]]; then
    echo "gpu_check: $ROOT/$need is missing: run scripts/gpu_prepare.sh (here) and carry .whl and .gpu-data" >&2
    exit 2
  fi
done

if [[ $DRY == 1 && $INPLACE == 0 ]]; then
  # the layout as it travels: tracked + untracked-not-ignored files, plus the carried folders
  stage=$(mktemp -d "${TMPDIR:-/tmp}/gpucheck-stage-XXXXXX")
  git ls-files -co --exclude-standard -z | while IFS= read -r -d '' f; do
    [[ -f $f ]] && mkdir -p "$stage/$(dirname "$f")" && cp -p "$f" "$stage/$f"
  done
  cp -r .whl .gpu-data "$stage/"
  echo "gpu_check: dry run from $stage (the travelling layout)"
  if [[ -z ${OUT:-} ]] && [[ " ${ARGS[*]:-} " != *" --out "* ]]; then
    export OUT="$ROOT/results/gpu-check-dry-$(date +%Y%m%d-%H%M%S)"
  fi
  bash "$stage/scripts/gpu_check.sh" --cpu-dry-run --in-place "${ARGS[@]}"
  rc=$?
  rm -rf "$stage"
  exit $rc
fi

if [[ $DRY == 1 ]]; then
  echo "gpu_check: DRY RUN on the CPU with $($PY -V 2>&1) at $(command -v "$PY") and its own flwr/hydra/torch;"
  echo "gpu_check: the carried cp312 wheels are checked, not installed or imported"
  "$PY" scripts/gpucheck/wheels.py check .whl || exit 3
  chk=$(mktemp -d)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux1_x86_64 --target "$chk" .whl/*.whl || { echo "gpu_check: pip refuses the wheels for cp312" >&2; exit 3; }
  rm -rf "$chk"
  echo "gpu_check: pip accepts the $(ls .whl/*.whl | wc -l) wheels for CPython 3.12 x86-64"
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  DRYFLAG=(--cpu-dry-run)
else
  echo "gpu_check: installing $(ls .whl/*.whl | wc -l) wheels into /tmp/site ..."
  t0=$(date +%s)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "gpu_check: the wheels did not install" >&2; exit 3; }
  echo "gpu_check: installed in $(( $(date +%s) - t0 )) s"
  export PYTHONPATH="/tmp/site:$ROOT" PATH="/tmp/site/bin:$PATH"
  DRYFLAG=()
fi

# a writable copy of the carried data cache (the dSprites generator writes there too)
cache=$(mktemp -d "${TMPDIR:-/tmp}/gpucheck-cache-XXXXXX")
cp .gpu-data/cache/*.npz "$cache/"
export FEDHEAD_CACHE=$cache OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
"$PY" scripts/gpucheck/run_all.py "${DRYFLAG[@]}" "${ARGS[@]}"
rc=$?
rm -rf "$cache"
exit $rc
