#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, only those that are missing.
# clang and its sanitizer/libFuzzer runtimes are for scripts/sanitize.sh (docs/security.md).
# Idempotent; needs root (or sudo) only when something is missing. No downloads besides Debian's.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build ccache pkg-config git file
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev prometheus-cpp-dev libgloo-dev libgtest-dev libgmock-dev
  nlohmann-json3-dev libspdlog-dev libssl-dev openssl
  python3 python3-numpy python3-grpcio python3-grpc-tools python3-yaml
  prometheus
  clang libclang-rt-14-dev
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
