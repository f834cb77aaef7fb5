#!/usr/bin/env bash
# Runs tollgate's whole test suite. The Redis tests start their own redis-server processes on
# free loopback ports, so redis-server must be installed: this script installs it (Debian's
# package) when it is missing, then runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "redis-server not found; installing Debian's redis-server package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
fi
redis-server --version

cargo test --all-features "$@"
