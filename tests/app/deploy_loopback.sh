#!/usr/bin/env bash
# Manual check of the fedhead deployment path on one machine (loopback only), flwr 1.42:
# one SuperLink, N SuperNodes (ClientApps in subprocess isolation) and `flwr run .` against
# them with a tiny job. Every process it starts is stopped by PID at the end (trap), and the
# Flower state lives in a temporary FLWR_HOME. Not part of pytest (about 2-3 minutes on 2
# busy CPU cores: every message starts a fresh ClientApp process that imports torch).
#
#   bash tests/app/deploy_loopback.sh                 # N=2 clients, 2 rounds
#   N=4 ROUNDS=1 PORT=39391 bash tests/app/deploy_loopback.sh
#
# Exit status: that of `flwr run`, or 1 when results.json is not `completed`.
set -u
N=${N:-2}; ROUNDS=${ROUNDS:-2}; PORT=${PORT:-39291}; LIMIT=${LIMIT:-400}
WORK=${WORK:-$(mktemp -d /tmp/fedhead-deploy-XXXX)}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
export FLWR_HOME=$WORK/flwr-home OMP_NUM_THREADS=1
mkdir -p "$FLWR_HOME" "$WORK/logs"
cat > "$FLWR_HOME/config.toml" <<TOML
[superlink]
default = "loopback"

[superlink.loopback]
address = "127.0.0.1:$PORT"
insecure = true
TOML
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; sleep 2;
            for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT
flower-superlink --insecure --host 127.0.0.1 --port "$PORT" \
    --disable-runtime-dependency-installation > "$WORK/logs/superlink.log" 2>&1 &
pids+=($!)
sleep 4
for k in $(seq 0 $((N - 1))); do
  flower-supernode --insecure --superlink "127.0.0.1:$PORT" --host 127.0.0.1 --port $((PORT + 10 + k)) \
      --node-config "partition-id=$k num-partitions=$N state-dir='$WORK/node$k'" \
      > "$WORK/logs/supernode$k.log" 2>&1 &
  pids+=($!)
done
sleep 3
cd "$REPO"
OVR="procedure=proximal model=free num_clients=$N rounds=$ROUNDS local_epochs=5 dataset.n_train=40 dataset.cache_dir=$WORK/cache"
timeout "$LIMIT" flwr run . loopback --stream \
    --run-config "overrides=\"$OVR\" output-dir=\"$WORK/out\""
rc=$?
echo "flwr run exit status: $rc; outputs in $WORK/out/proximal; logs in $WORK/logs"
python - "$WORK/out/proximal/results.json" <<'PY' || rc=1
import json, sys
r = json.load(open(sys.argv[1]))
print("results.json:", r["status"], "rounds", [x["round"] for x in r["rounds"]],
      "e_F(G_star) last", r["rounds"][-1]["e_f_star"], "fab", r["provenance"].get("fab", {}).get("fab_hash", "")[:12])
sys.exit(0 if r["status"] == "completed" else 1)
PY
exit $rc
