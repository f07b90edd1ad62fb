#!/usr/bin/env bash
# End-to-end check of the docker compose deployment (docs/deployment.md, section 3):
# builds the base image if missing, fills the build context, builds fedhead:latest, makes
# certificates and SuperNode keys, brings up SuperLink + 2 SuperNodes + ServerApp/ClientApp
# SuperExecs with TLS, SuperNode authentication and the state volume, runs a tiny job with
# the host's `flwr run`, checks its results.json and tears everything down (also on failure
# or Ctrl-C). Every wait has a deadline.
#
#   scripts/docker_check.sh              # all steps
#   scripts/docker_check.sh build        # only base image, build context and image
#
# Needs: a running docker daemon, docker-compose (Debian's 1.29 or v2 as `docker compose`,
# set COMPOSE="docker compose"), openssl, ssh-keygen, and the flwr CLI on PATH (the
# project's virtual environment). Run from anywhere; it works in the repository root.
# Environment (defaults): FEDHEAD_SUPERLINK_PORT (39800) and FEDHEAD_BIND_ADDRESS
# (127.0.0.1) for the published SuperLink port, FEDHEAD_BASE_IMAGE (fedhead-base:bookworm),
# DEBIAN_MIRROR (apt's own, by scripts/debian_mirror.sh), RUN_LIMIT (900 s for `flwr run`),
# KEEP_UP=1 to leave the stack running for inspection.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
STEP=${1:-all}
COMPOSE=${COMPOSE:-docker-compose}
export FEDHEAD_SUPERLINK_PORT=${FEDHEAD_SUPERLINK_PORT:-39800}
export FEDHEAD_BIND_ADDRESS=${FEDHEAD_BIND_ADDRESS:-127.0.0.1}
export FEDHEAD_BASE_IMAGE=${FEDHEAD_BASE_IMAGE:-fedhead-base:bookworm}
export FEDHEAD_CERTS=${FEDHEAD_CERTS:-$REPO/certs}
RUN_LIMIT=${RUN_LIMIT:-900}
FILES=(-f docker-compose.yml -f with-state.yml)   # TLS and SuperNode authentication: the base file
log() { printf '[docker_check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# ---- 1. base image: Debian bookworm minbase from debootstrap, when it is not there ---------
if ! docker image inspect "$FEDHEAD_BASE_IMAGE" > /dev/null 2>&1; then
  if [[ $FEDHEAD_BASE_IMAGE != fedhead-base:bookworm ]]; then
    log "base image $FEDHEAD_BASE_IMAGE missing: pull it or build fedhead-base:bookworm"; exit 1
  fi
  MIRROR=${DEBIAN_MIRROR:-$("$REPO/scripts/debian_mirror.sh")}   # one-line and deb822 sources alike
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  ROOTFS=$(mktemp -d /tmp/fedhead-rootfs-XXXX)
  log "debootstrap bookworm from $MIRROR into $ROOTFS (about 2 minutes)"
  timeout 900 debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" > "$ROOTFS.log" 2>&1 \
    || { log "debootstrap failed, see $ROOTFS.log"; exit 1; }
  tar -C "$ROOTFS" -c . | docker import - fedhead-base:bookworm
  rm -rf "$ROOTFS" "$ROOTFS.log"
fi

# ---- 2. build context extras (git-ignored and docker-ignored apart from these) -------------
mkdir -p .docker-build/wheels
cp /etc/ssl/certs/ca-certificates.crt .docker-build/ca-certificates.crt
# the host's PyPI index settings, when PyPI is reached through a mirror (file:// indexes and
# find-links are host folders: the wheels they serve are copied below instead)
{
  echo "[global]"
  idx=${PIP_INDEX_URL:-$(pip config get global.index-url 2>/dev/null || true)}
  [[ $idx == http* ]] && echo "index-url = $idx"
  extra=$(pip config get global.extra-index-url 2>/dev/null || true)
  extra=$(tr ' ' '\n' <<< "${PIP_EXTRA_INDEX_URL:-$extra}" | grep '^http' | tr '\n' ' ' || true)
  [[ -n ${extra// /} ]] && echo "extra-index-url = $extra"
  true
} > .docker-build/pip.conf
if ! ls .docker-build/wheels/torch-2.14.1-*.whl > /dev/null 2>&1 \
   || ! ls .docker-build/wheels/torchvision-0.29.1-*.whl > /dev/null 2>&1; then
  log "collecting torch==2.14.1 torchvision==0.29.1 and their dependencies into .docker-build/wheels"
  timeout 1800 pip download -q --dest .docker-build/wheels torch==2.14.1 torchvision==0.29.1
fi

# ---- 3. the image --------------------------------------------------------------------------
log "building fedhead:latest (the first build installs torch: several minutes)"
timeout 3600 docker build -t fedhead:latest --build-arg "BASE_IMAGE=$FEDHEAD_BASE_IMAGE" . \
    > .docker-build/build.log 2>&1 || { tail -30 .docker-build/build.log; log "docker build failed"; exit 1; }
[[ $STEP == build ]] && { log "image built"; exit 0; }

# ---- 4. certificates, SuperNode keys, flwr CLI connection ----------------------------------
scripts/make_certs.sh "$FEDHEAD_CERTS" 2 > /dev/null
[[ $(id -u) == 0 ]] && chown -R 1000:1000 "$FEDHEAD_CERTS"   # readable by the containers' user
WORK=$(mktemp -d /tmp/fedhead-docker-XXXX)
export FLWR_HOME=$WORK/flwr-home
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "docker"

[superlink.docker]
address = "127.0.0.1:$FEDHEAD_SUPERLINK_PORT"
root-certificates = "$FEDHEAD_CERTS/ca.crt"
TOML

cleanup() {
  rc=$?
  if [[ ${KEEP_UP:-0} == 1 ]]; then log "KEEP_UP=1: stack left running"; exit $rc; fi
  log "logs of the stack: $WORK/compose.log"
  timeout 120 $COMPOSE "${FILES[@]}" logs --no-color > "$WORK/compose.log" 2>&1 || true
  log "tearing down"
  timeout 180 $COMPOSE "${FILES[@]}" down -v --remove-orphans > /dev/null 2>&1 || true
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_for() {  # seconds description command...
  local limit=$1 what=$2; shift 2
  local t0=$SECONDS
  until "$@" > /dev/null 2>&1; do
    (( SECONDS - t0 > limit )) && { log "timeout after ${limit}s waiting for $what"; return 1; }
    sleep 2
  done
  log "$what after $((SECONDS - t0))s"
}
nodes_online() {  # n: at least n SuperNodes online
  flwr supernode ls docker --format json \
    | python3 -c "import json,sys; n=[x for x in json.load(sys.stdin)['nodes'] if x['status']=='online']; sys.exit(len(n) < $1)"
}

# ---- 5. up: SuperLink first, register the SuperNode keys, then the rest --------------------
log "starting the SuperLink on $FEDHEAD_BIND_ADDRESS:$FEDHEAD_SUPERLINK_PORT"
timeout 300 $COMPOSE "${FILES[@]}" up -d superlink
wait_for 120 "SuperLink answers (TLS, Control API)" flwr supernode ls docker
for k in 1 2; do
  timeout 60 flwr supernode register "$FEDHEAD_CERTS/supernode-$k.auth.pub" docker
done
timeout 300 $COMPOSE "${FILES[@]}" up -d
wait_for 180 "2 SuperNodes online" nodes_online 2

# ---- 6. a tiny job -------------------------------------------------------------------------
OVR="procedure=proximal model=free num_clients=2 rounds=1 local_epochs=2 dataset.n_train=40"
log "flwr run (limit ${RUN_LIMIT}s)"
timeout "$RUN_LIMIT" flwr run . docker --stream \
    --run-config "overrides=\"$OVR\" output-dir=\"/data/outputs\"" | tee "$WORK/run.log"
timeout 60 $COMPOSE "${FILES[@]}" exec -T serverapp cat /data/outputs/proximal/results.json > "$WORK/results.json"
python3 - "$WORK/results.json" <<'PY'
import json, math, sys
r = json.load(open(sys.argv[1]))
rounds = r["rounds"]
nums = [v for x in rounds for v in x.values() if isinstance(v, (int, float))]
ok = r["status"] == "completed" and [x["round"] for x in rounds] == [0, 1] \
     and all(math.isfinite(v) for v in nums)
print("results.json:", r["status"], "rounds", [x["round"] for x in rounds],
      "e_F(G_star) last", rounds[-1]["e_f_star"], "->", "OK" if ok else "FAILED")
sys.exit(0 if ok else 1)
PY
log "private state stays in the clientapp containers:"
timeout 60 $COMPOSE "${FILES[@]}" exec -T clientapp-1 find /data/state -name '*.pt' | head -3
log "docker check passed"
