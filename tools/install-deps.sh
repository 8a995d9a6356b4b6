#!/usr/bin/env bash
# install-deps.sh: install the system packages cpgen builds with (Debian/Ubuntu, as root).
# --check-only: exit 0 when everything is present, 1 otherwise, installing nothing.
set -euo pipefail
missing=()
[ -f /usr/include/lua5.4/lua.h ] && [ -f /usr/lib/x86_64-linux-gnu/liblua5.4.a ] || missing+=(liblua5.4-dev)
[ -f /usr/include/cmocka.h ] || missing+=(libcmocka-dev)
command -v python3 >/dev/null || missing+=(python3)
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if [ "${1:-}" = "--check-only" ]; then exit 1; fi
if [ ! -d "${CUDA:-/usr/local/cuda}/include" ]; then
  echo "install-deps: the CUDA toolkit is not at ${CUDA:-/usr/local/cuda}; install CUDA 13 or set CUDA=path" >&2
  exit 1
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run 'sudo apt-get install ${missing[*]}'" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
