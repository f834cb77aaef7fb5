#!/usr/bin/env bash
# What a check costs Redis, next to the seed articles' scripts: runs benches/redis_cost.rs,
# which starts its own redis-server on a free loopback port (and a Redis Cluster of three
# masters for its last section), drives it with redis-benchmark
# and Limiter::check, and stops it when done. Installs Debian's redis-server and redis-tools
# (redis-benchmark) when they are missing. Arguments go to the bench: --rounds N (best of N
# runs per row, default 5), --calls N (calls per run, default 20000), --seconds S (per
# throughput row, default 2), --only cluster (the Redis Cluster rows alone), --only GROUP
# (one group of the per-call rows, by the first word of its title: log, concurrency...).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
  echo "redis-server or redis-benchmark not found; installing Debian's packages" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools >/dev/null
fi

cargo bench --bench redis_cost -- "$@"
