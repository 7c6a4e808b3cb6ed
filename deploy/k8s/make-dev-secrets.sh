#!/usr/bin/env bash
# Development Secrets for deploy/k8s (docs/security.md): a private CA, the certificates and one API token, made
# with scripts/make-dev-certs.sh (openssl) in WORKDIR and printed as Kubernetes Secret YAML on stdout.
#
#   deploy/k8s/make-dev-secrets.sh WORKDIR [API_NAME...] | kubectl apply -f -
#   dsv4-bench --target localhost:50051 --tls-ca WORKDIR/ca.crt --token-file WORKDIR/tokens   (port-forward)
#
# Secrets (the names and keys the manifests mount; cert-manager Certificates can produce the same):
#   dsv4-worker-tls       tls.crt tls.key ca.crt  every worker rank: server certificate named dsv4-worker.dsv4.svc
#                                                 (also its client certificate towards its leader), cluster CA
#   dsv4-coordinator-tls  tls.crt tls.key ca.crt  the coordinator's client certificate towards workers, cluster CA
#   dsv4-api-tls          tls.crt tls.key ca.crt  the API's server certificate: dsv4-coordinator.dsv4.svc,
#                                                 ...svc.cluster.local, localhost, 127.0.0.1 and any API_NAME
#   dsv4-api-tokens       tokens                  bearer tokens accepted by the API, one per line
# WORKDIR keeps the CA and the token: running again reissues the certificates from the same CA and keeps the
# token. Production: use your own CA and keep the CA key out of the cluster.
set -euo pipefail
[ $# -ge 1 ] || { sed -n '5,6p' "$0" >&2; exit 2; }
dir=$1
shift
certs="$(cd "$(dirname "$0")/../.." && pwd)/scripts/make-dev-certs.sh"
mkdir -p "$dir"
[ -f "$dir/ca.crt" ] && [ -f "$dir/ca.key" ] || "$certs" ca "$dir"
"$certs" cert "$dir" worker dsv4-worker.dsv4.svc
"$certs" cert "$dir" coordinator dsv4-coordinator.dsv4.svc
"$certs" cert "$dir" api dsv4-coordinator.dsv4.svc dsv4-coordinator.dsv4.svc.cluster.local localhost 127.0.0.1 "$@"
[ -f "$dir/tokens" ] || (umask 077 && openssl rand -hex 32 > "$dir/tokens")

# secret NAME KEY FILE [KEY FILE...]
secret() {
  local name=$1
  shift
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: dsv4\ntype: Opaque\ndata:\n' "$name"
  while [ $# -gt 0 ]; do
    printf '  %s: %s\n' "$1" "$(base64 -w0 < "$2")"
    shift 2
  done
}
secret dsv4-worker-tls tls.crt "$dir/worker.crt" tls.key "$dir/worker.key" ca.crt "$dir/ca.crt"
secret dsv4-coordinator-tls tls.crt "$dir/coordinator.crt" tls.key "$dir/coordinator.key" ca.crt "$dir/ca.crt"
secret dsv4-api-tls tls.crt "$dir/api.crt" tls.key "$dir/api.key" ca.crt "$dir/ca.crt"
secret dsv4-api-tokens tokens "$dir/tokens"
