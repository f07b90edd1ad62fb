#!/usr/bin/env bash
# End-to-end check of the docker compose deployment (docs/deployment.md, section 3), from a clean
# clone of this repository's HEAD (uncommitted changes are not in it): builds the base image if
# missing and the image fedhead:latest, then brings up SuperLink, N SuperNodes and the ServerApp /
# ClientApp SuperExecs with TLS, SuperNode authentication and the state volume, each site with one
# of the own-data tutorial's files, its signing key and the roster (scripts/compose_sites.py N),
# runs one clear and one secure job with the host's `flwr run`, checks that each run finished as
# completed (`flwr ls`, whatever `flwr run` exits with) and that its results.json equals the same
# job run in process (`fedhead-run`), and takes everything down (also on failure or Ctrl-C).
# Every wait has a deadline. It removes only what it made: its temporary folder and its own
# compose project (a name of its own: its containers, network and volumes); the images stay.
#
#   scripts/docker_check.sh              # all steps
#   scripts/docker_check.sh build        # only the clean clone, the base image and the image
#
# Needs: a running docker daemon, docker-compose (Debian's 1.29 or v2 as `docker compose`,
# set COMPOSE="docker compose"), git, openssl, ssh-keygen, and the flwr CLI, fedhead-run and
# fedhead-keys on PATH (the project's virtual environment). Environment (defaults):
# FEDHEAD_SITE_COUNT (3: the sites; secure mode needs 3 or more), FEDHEAD_SUPERLINK_PORT (39800)
# and FEDHEAD_BIND_ADDRESS (127.0.0.1) for the published SuperLink port, FEDHEAD_BASE_IMAGE
# (fedhead-base:bookworm), DEBIAN_MIRROR (apt's own, by scripts/debian_mirror.sh), FEDHEAD_WHEELS
# (.docker-build/wheels of this checkout: the torch wheels, downloaded once), RUN_LIMIT (900 s per
# `flwr run`), TOL (1e-9: relative difference of G_cen and the final Gram), KEEP_UP=1 to leave the
# stack and the temporary folder for inspection.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
STEP=${1:-all}
COMPOSE=${COMPOSE:-docker-compose}
SITES=${FEDHEAD_SITE_COUNT:-3}
export FEDHEAD_SUPERLINK_PORT=${FEDHEAD_SUPERLINK_PORT:-39800}
export FEDHEAD_BIND_ADDRESS=${FEDHEAD_BIND_ADDRESS:-127.0.0.1}
export FEDHEAD_BASE_IMAGE=${FEDHEAD_BASE_IMAGE:-fedhead-base:bookworm}
WHEELS=${FEDHEAD_WHEELS:-$SRC/.docker-build/wheels}
RUN_LIMIT=${RUN_LIMIT:-900}
TOL=${TOL:-1e-9}
log() { printf '[docker_check %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# ---- 0. a clean clone in a temporary folder; a compose project of its own ----------------
WORK=$(mktemp -d /tmp/fedhead-docker-XXXXXX)
export COMPOSE_PROJECT_NAME
COMPOSE_PROJECT_NAME=$(basename "$WORK" | tr -c 'a-zA-Z0-9\n' '-' | tr 'A-Z' 'a-z')
[[ -z $(git -C "$SRC" status --porcelain --untracked-files=no) ]] \
  || log "note: uncommitted changes of $SRC are not in the clean clone"
git clone -q "$SRC" "$WORK/src"
cd "$WORK/src"
log "clean clone of $(git rev-parse --short HEAD) in $WORK/src, compose project $COMPOSE_PROJECT_NAME"
STARTED=0
cleanup() {
  rc=$?
  if [[ ${KEEP_UP:-0} == 1 ]]; then log "KEEP_UP=1: stack and $WORK left"; exit $rc; fi
  if [[ $STARTED == 1 ]]; then
    timeout 120 $COMPOSE "${FILES[@]}" logs --no-color > "$SRC/.docker-build/compose.log" 2>&1 || true
    log "logs of the stack: $SRC/.docker-build/compose.log; tearing down"
    timeout 180 $COMPOSE "${FILES[@]}" down -v --remove-orphans > /dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$SRC/.docker-build"

# ---- 1. base image: Debian bookworm minbase from debootstrap, when it is not there ---------
if ! docker image inspect "$FEDHEAD_BASE_IMAGE" > /dev/null 2>&1; then
  if [[ $FEDHEAD_BASE_IMAGE != fedhead-base:bookworm ]]; then
    log "base image $FEDHEAD_BASE_IMAGE missing: pull it or build fedhead-base:bookworm"; exit 1
  fi
  MIRROR=${DEBIAN_MIRROR:-$("$SRC/scripts/debian_mirror.sh")}   # one-line and deb822 sources alike
  MIRROR=${MIRROR:-http://deb.debian.org/debian}
  log "debootstrap bookworm from $MIRROR (about 2 minutes)"
  timeout 900 debootstrap --variant=minbase bookworm "$WORK/rootfs" "$MIRROR" > "$WORK/rootfs.log" 2>&1 \
    || { tail -20 "$WORK/rootfs.log"; log "debootstrap failed"; exit 1; }
  tar -C "$WORK/rootfs" -c . | docker import - fedhead-base:bookworm > /dev/null
  rm -rf "$WORK/rootfs"
fi

# ---- 2. build context extras (git-ignored and docker-ignored apart from these) -------------
mkdir -p .docker-build "$WHEELS"
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
if ! ls "$WHEELS"/torch-2.14.1-*.whl > /dev/null 2>&1 || ! ls "$WHEELS"/torchvision-0.29.1-*.whl > /dev/null 2>&1; then
  log "collecting torch==2.14.1 torchvision==0.29.1 and their dependencies into $WHEELS"
  timeout 1800 pip download -q --dest "$WHEELS" torch==2.14.1 torchvision==0.29.1
fi
cp -al "$WHEELS" .docker-build/wheels 2> /dev/null || cp -a "$WHEELS" .docker-build/wheels

# ---- 3. the image --------------------------------------------------------------------------
log "building fedhead:latest (the first build installs torch: several minutes)"
t0=$SECONDS
timeout 3600 docker build -t fedhead:latest --build-arg "BASE_IMAGE=$FEDHEAD_BASE_IMAGE" . \
    > "$SRC/.docker-build/build.log" 2>&1 \
  || { tail -30 "$SRC/.docker-build/build.log"; log "docker build failed"; exit 1; }
size=$(docker image inspect -f '{{.Size}}' fedhead:latest)
log "image fedhead:latest built in $((SECONDS - t0))s, $((size / 1000000)) MB"
[[ $STEP == build ]] && { log "image built"; exit 0; }

# ---- 4. the sites' files, certificates, signing keys and roster, the overlay, CLI connection
export PYTHONPATH=$WORK/src   # the host's fedhead-run and fedhead-keys run the clone's code
python3 examples/own-data/make_sites.py --rows 100 --sites "$SITES" --out "$WORK/data" > /dev/null
mapfile -t FILES_IN < <(ls "$WORK"/data/site_*.csv)
for k in $(seq 1 "$SITES"); do
  mkdir -p "sites/site-$k" && cp "${FILES_IN[$((k - 1))]}" "sites/site-$k/site.csv"
  fedhead-keys new-site "site-$k" --dir keys > /dev/null   # on a real site: each on its own host
done
fedhead-keys roster keys/site-*.roster.json --out keys/roster.json
scripts/make_certs.sh certs "$SITES" > /dev/null
[[ $(id -u) == 0 ]] && chown -R 1000:1000 certs keys sites   # readable by the containers' user
python3 scripts/compose_sites.py "$SITES" > with-sites.yml
FILES=(-f docker-compose.yml -f with-state.yml -f with-sites.yml)
export FLWR_HOME=$WORK/flwr-home
mkdir -p "$FLWR_HOME"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "docker"

[superlink.docker]
address = "127.0.0.1:$FEDHEAD_SUPERLINK_PORT"
root-certificates = "$WORK/src/certs/ca.crt"
TOML

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
run_status() {  # run id: its status as the SuperLink records it (finished:completed, finished:failed, ...)
  flwr ls docker --run-id "$1" --format json | python3 -c "import json,sys; print(json.load(sys.stdin)['runs'][0]['status'])"
}
run_finished() { [[ $(run_status "$1") == finished* ]]; }

# ---- 5. up: SuperLink first, register the SuperNode keys, then the rest --------------------
log "starting the SuperLink on $FEDHEAD_BIND_ADDRESS:$FEDHEAD_SUPERLINK_PORT"
STARTED=1
t_up=$SECONDS
timeout 300 $COMPOSE "${FILES[@]}" up -d superlink
wait_for 120 "SuperLink answers (TLS, Control API)" flwr supernode ls docker
for k in $(seq 1 "$SITES"); do
  timeout 60 flwr supernode register "certs/supernode-$k.auth.pub" docker > /dev/null
done
timeout 300 $COMPOSE "${FILES[@]}" up -d
wait_for 180 "$SITES SuperNodes online" nodes_online "$SITES"
log "stack up: $((SECONDS - t_up))s from the SuperLink's start to $SITES SuperNodes online"

# ---- 6. one clear and one secure job, each against the same job in process -----------------
JOB="dataset=table dataset.targets=[t1,t2] model=free procedure=proximal rounds=1 local_epochs=50"
JOB="$JOB resources.evaluate_mse=false output.tensorboard=false output.figures=false"
listed=$(IFS=,; echo "${FILES_IN[*]}")
job() {  # name extra-overrides
  local name=$1 extra=$2 t0=$SECONDS run_id status
  log "$name job: flwr run (limit ${RUN_LIMIT}s)"
  local rc=0
  timeout "$RUN_LIMIT" flwr run . docker --stream --run-config \
      "overrides=\"$JOB dataset.files=[] dataset.num_clients=$SITES $extra\" output-dir=\"/data/outputs/$name\" roster=\"/keys/roster.json\"" \
      > "$WORK/$name.log" 2>&1 || rc=$?
  if (( rc != 0 )); then
    tail -40 "$WORK/$name.log"
    (( rc == 124 )) && log "$name job: flwr run still running after RUN_LIMIT=${RUN_LIMIT}s" \
                    || log "$name job: flwr run exited with $rc"
    return 1
  fi
  local wall=$((SECONDS - t0))
  run_id=$(grep -o 'Successfully started run [0-9]*' "$WORK/$name.log" | awk '{print $4}')
  [[ -n $run_id ]] || { tail -40 "$WORK/$name.log"; log "$name job: no run started"; return 1; }
  wait_for 60 "$name job: run $run_id finished" run_finished "$run_id"
  status=$(run_status "$run_id")
  timeout 60 $COMPOSE "${FILES[@]}" exec -T serverapp cat "/data/outputs/$name/proximal/results.json" \
      > "$WORK/$name.deployed.json" 2> /dev/null || true
  if [[ $status != finished:completed ]]; then
    tail -40 "$WORK/$name.log"; log "$name job: run $run_id $status (the ServerApp failed)"; return 1
  fi
  log "$name job: run $run_id $status in ${wall}s (flwr run)"
  python3 - "$WORK/$name.deployed.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))["timing"]
phases = t.get("phases", [])
print("  timing: ServerApp start to first phase %.1f s, phases %s" % (
    t.get("startup_seconds") or 0, ", ".join("%s %.1f" % (k, s) for k, s in phases)))
trains = [i for i, (k, _) in enumerate(phases) if k == "train"] + [len(phases)]
if len(trains) > 1:  # round 1: its training phase and every phase up to the next one (secure: its SecAgg steps)
    first = (t.get("startup_seconds") or 0) + sum(s for _, s in phases[: trains[1]])
    print("  round 1: %.1f s; from the ServerApp's start to round 1 done: %.1f s" % (
        sum(s for _, s in phases[trains[0] : trains[1]]), first))
PY
  timeout 900 fedhead-run $JOB "dataset.files=[$listed]" $extra "output.dir=$WORK/ref-$name" \
      > "$WORK/ref-$name.log" 2>&1 || { tail -20 "$WORK/ref-$name.log"; log "$name job: fedhead-run failed"; return 1; }
  python3 scripts/same_results.py "$WORK/$name.deployed.json" "$WORK/ref-$name/proximal/results.json" --tol "$TOL"
}
job clear ""
job secure "privacy.mode=secure"
log "private state stays in the clientapp containers:"
timeout 60 $COMPOSE "${FILES[@]}" exec -T clientapp-1 find /data/state -name '*.pt' | head -3
log "docker check passed"
