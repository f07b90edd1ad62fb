#!/usr/bin/env bash
# Local test PKI for a fedhead / Flower 1.42 deployment (TLS and SuperNode authentication).
#
#   scripts/make_certs.sh [OUT_DIR] [N_SUPERNODES]      # defaults: certs 2
#
# Writes into OUT_DIR (created; existing files are kept, so a second call is a no-op):
#   ca.crt, ca.key                     a self-signed CA ("fedhead local CA"), 365 days
#   superlink.crt, superlink.key       server certificate of the SuperLink
#   supernode-K.crt, supernode-K.key   server certificate of SuperNode K's runtime API
#                                      (K = 1..N; used when ClientApps run in separate
#                                      containers, `--isolation process`)
#   every server certificate has SANs DNS:<name>, DNS:localhost, IP:127.0.0.1, so the same
#   files serve the loopback deployment and the docker compose services of that name;
#   EXTRA_SANS="DNS:host.example,IP:10.0.0.5" adds SANs (e.g. the address that remote
#   SuperNodes and the flwr CLI use for the SuperLink)
#   supernode-K.auth, supernode-K.auth.pub
#                                      ECDSA P-384 key pair in OpenSSH format for SuperNode
#                                      authentication (flower-superlink --enable-supernode-auth,
#                                      `flwr supernode register supernode-K.auth.pub`,
#                                      flower-supernode --auth-supernode-private-key)
#   superlink.superexec.secret         shared secret of the SuperLink's runtime API and the
#                                      SuperExec running the ServerApp (process isolation,
#                                      --superexec-auth-secret-file on both)
#   supernode-K.superexec.secret       shared secret of SuperNode K's runtime API and the
#                                      SuperExec running its ClientApps (one per SuperNode:
#                                      no secret is shared by two sites)
# Needs openssl and ssh-keygen. For tests and local deployments only: a real federation uses
# certificates of its own CA and keeps private keys on the machine that uses them.
set -euo pipefail
OUT=${1:-certs}
N=${2:-2}
mkdir -p "$OUT"
cd "$OUT"
umask 077

if [[ ! -f ca.crt ]]; then
  openssl req -x509 -new -nodes -newkey rsa:2048 -sha256 -days 365 \
      -keyout ca.key -out ca.crt -subj "/CN=fedhead local CA" 2>/dev/null
fi

server_cert() {  # name
  local name=$1
  [[ -f $name.crt ]] && return 0
  openssl req -new -nodes -newkey rsa:2048 -sha256 -keyout "$name.key" -out "$name.csr" \
      -subj "/CN=$name" 2>/dev/null
  printf '%s\n' "subjectAltName=DNS:$name,DNS:localhost,IP:127.0.0.1${EXTRA_SANS:+,$EXTRA_SANS}" \
      "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
      "extendedKeyUsage=serverAuth" > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -sha256 \
      -days 365 -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

server_cert superlink
for k in $(seq 1 "$N"); do
  server_cert "supernode-$k"
  [[ -f supernode-$k.auth ]] || ssh-keygen -q -t ecdsa -b 384 -N "" -C "supernode-$k" -f "supernode-$k.auth"
done
for name in superlink $(seq -f 'supernode-%g' 1 "$N"); do
  [[ -f $name.superexec.secret ]] || openssl rand -hex 32 | tr -d '\n' > "$name.superexec.secret"
done
# public material is world-readable; private keys stay owner-only (0600)
chmod 644 ./*.crt ./*.pub
echo "certificates and keys in $(pwd)"
