#!/usr/bin/env bash
# Makes a private CA and certificates signed by it, with the openssl CLI: for tests and for a development
# cluster (docs/security.md). Production certificates come from your own CA (e.g. cert-manager), not from here.
#
#   scripts/make-dev-certs.sh ca DIR                      -> DIR/ca.crt, DIR/ca.key (a new CA)
#   scripts/make-dev-certs.sh cert DIR NAME SAN [SAN...]  -> DIR/NAME.crt, DIR/NAME.key signed by DIR/ca.*
#
# SANs are DNS names or IP addresses (127.0.0.1, localhost, dsv4-worker.dsv4.svc, ...). Leaf certificates
# carry extendedKeyUsage serverAuth and clientAuth: a worker's certificate is its server certificate and, on a
# follower rank, its client certificate towards the leader. EC P-256 keys, unencrypted PEM (mode 0600);
# validity DAYS (default 365) days.
set -euo pipefail
usage() { sed -n '5,6p' "$0" >&2; exit 2; }
[ $# -ge 2 ] || usage
cmd=$1 dir=$2
days=${DAYS:-365}
mkdir -p "$dir"
umask 077
case "$cmd" in
  ca)
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days "$days" \
      -subj "/CN=dsv4 development CA $(openssl rand -hex 4)" \
      -addext "keyUsage=critical,keyCertSign,cRLSign" \
      -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
    ;;
  cert)
    [ $# -ge 4 ] || usage
    name=$3
    shift 3
    [ -f "$dir/ca.crt" ] && [ -f "$dir/ca.key" ] || { echo "no CA in $dir: run '$0 ca $dir' first" >&2; exit 1; }
    sans=()
    for s in "$@"; do
      if [[ $s =~ ^[0-9.]+$ || $s == *:* ]]; then sans+=("IP:$s"); else sans+=("DNS:$s"); fi
    done
    ext=$(mktemp)
    trap 'rm -f "$ext" "$dir/$name.csr"' EXIT
    {
      echo "basicConstraints=critical,CA:FALSE"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=serverAuth,clientAuth"
      echo "subjectAltName=$(IFS=,; echo "${sans[*]}")"
    } > "$ext"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "/CN=$name" \
      -keyout "$dir/$name.key" -out "$dir/$name.csr" 2>/dev/null
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
      -set_serial "0x$(openssl rand -hex 12)" -days "$days" -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
    ;;
  *) usage ;;
esac
