#!/usr/bin/env bash
# Prepare, on THIS machine (with a package registry), what the GPU check carries to the lent
# GPU machine, which reaches no registry and has no gymnasium/MuJoCo:
#
#   bash scripts/gpu_prepare.sh
#
#   .whl/       cp312 / pure-Python wheels of flwr 1.42, hydra-core, omegaconf and those of their
#               dependencies that the device image lacks or pins differently (the list of what the
#               image holds is scripts/gpucheck/device_packages.txt, from the device's KINDS.md);
#               grpcio and protobuf travel although the image has them, because flwr's generated
#               code checks their versions at import. numpy and uv (flwr's runtime dependency
#               installer, disabled here) stay behind: together they would be 32 MiB.
#               antlr4-python3-runtime 4.9.3 (hydra's) exists only as an sdist: built here.
#   .gpu-data/  cache/  the MuJoCo Hopper transitions (fedhead's data cache, $FEDHEAD_CACHE):
#                       generated here with gymnasium, which the device lacks
#               certs/  a local CA and the SuperLink / SuperNode certificates (scripts/make_certs.sh)
#
# Both folders are git-ignored (.gitignore) and travel with run(carry=[".whl", ".gpu-data"]).
# Ends by printing the travelling size (repo files + carried folders; the limit is 64 MiB).
# Run again after changing a version below or the Hopper generator (it redoes what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-python3}

FLWR=flwr==1.42.0
HYDRA=hydra-core==1.3.8
OMEGACONF=omegaconf==2.3.1
ANTLR=antlr4-python3-runtime==4.9.3
PLATFORMS=(manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64
           manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64)

# ---------------------------------------------------------------------------- wheels
want="$FLWR $HYDRA $OMEGACONF $ANTLR"
if [[ -f .whl/.complete && "$(cat .whl/.complete)" == "$want" ]]; then
  echo "wheels: .whl/ is complete ($want)"
else
  full=$(mktemp -d)
  trap 'rm -rf "$full"' EXIT
  echo "wheels: building $ANTLR (sdist only on PyPI) ..."
  "$PY" -m pip wheel -q --no-deps -w "$full" "$ANTLR" 2> >(grep -v "^WARNING: Location" >&2)
  plat=()
  for p in "${PLATFORMS[@]}"; do plat+=(--platform "$p"); done
  echo "wheels: resolving the cp312 closure of $FLWR $HYDRA $OMEGACONF ..."
  "$PY" -m pip download -q --find-links "$full" --only-binary=:all: --python-version 3.12 \
      --implementation cp "${plat[@]}" -d "$full" "$FLWR" "$HYDRA" "$OMEGACONF" 2> >(grep -v "^WARNING: Location" >&2)
  rm -rf .whl && mkdir .whl
  "$PY" scripts/gpucheck/wheels.py select "$full" .whl
  echo "$want" > .whl/.complete
fi
"$PY" scripts/gpucheck/wheels.py check .whl

# ---------------------------------------------------------------------------- data and certificates
mkdir -p .gpu-data/cache
echo "data: the Hopper transitions into .gpu-data/cache (fedhead's cache; generated with gymnasium) ..."
FEDHEAD_CACHE="$ROOT/.gpu-data/cache" PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" - <<'EOF'
from fedhead.data.pipeline import cache_file
from fedhead.data.registry import load_raw, make_config

cfg = make_config("hopper")
raw = load_raw(cfg)
print(f"  hopper: x {raw.x.shape} y {raw.y.shape} -> {cache_file(cfg)}")
EOF
rm -f .gpu-data/cache/*.lock
bash scripts/make_certs.sh .gpu-data/certs 4 >/dev/null
echo "certificates: .gpu-data/certs (CA, SuperLink and 4 SuperNodes)"

# ---------------------------------------------------------------------------- travelling size
"$PY" scripts/gpucheck/wheels.py size "$ROOT" .whl .gpu-data
