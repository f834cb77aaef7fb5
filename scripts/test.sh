#!/usr/bin/env bash
# Runs tollgate's whole test suite. The Redis tests start their own redis-server processes on
# free loopback ports, so redis-server must be installed: this script installs it (Debian's
# package) when it is missing, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server for every Redis test; procps for `kill`, which the cluster tests send
# signals with; openssl for the certificates of the TLS tests (a minimal Debian has none).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v openssl >/dev/null 2>&1 || missing+=(openssl)
# (the program: the shell's own `kill` is a builtin)
[ -n "$(type -P kill)" ] || missing+=(procps)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian's ${missing[*]} (missing)" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null 2>&1; then
      echo "run as root, or install sudo, or install ${missing[*]} first" >&2
      exit 1
    fi
    sudo="sudo"
  fi
  $sudo apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
redis-server --version

cargo test --all-features "$@"
