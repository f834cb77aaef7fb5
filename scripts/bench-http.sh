#!/usr/bin/env bash
# Requests per second of an axum hello-world server, bare, behind tower_governor and behind
# tollgate's RateLimitLayer (memory store, 1 and 3 limits, headers on), under wrk with fixed
# connections. Builds benches/http_server.rs (bench profile), installs Debian's wrk when it is
# missing, pins the server to CPU 0 and wrk to CPU 1 when taskset exists, and prints the table
# with ratios to bare axum and to tower_governor.
#
# scripts/bench-http.sh [SECONDS (default 10)] [CONNECTIONS (default 64)] [ROUNDS (default 1)]
#                       [SVG (a file to draw the table into as a bar chart)]
#
# HTTP_SERVER_BIN=path runs that build of the server instead of building one (to compare two
# builds on the same machine state).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-10}"
conns="${2:-64}"
rounds="${3:-1}"
svg="${4:-}"
port=39871

if ! command -v wrk >/dev/null 2>&1; then
  echo "wrk not found; installing Debian's package" >&2
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi

if [ -n "${HTTP_SERVER_BIN:-}" ]; then
  bin="$HTTP_SERVER_BIN"
else
  cargo bench --bench http_server --no-run 2>&1 | tail -1
  bin=$(cargo bench --bench http_server --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*http_server[^"]*\)".*/\1/p' | tail -1)
fi
[ -x "$bin" ] || { echo "http_server binary not found" >&2; exit 1; }

server_pin=()
client_pin=()
if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
  server_pin=(taskset -c 0)
  client_pin=(taskset -c 1)
fi

declare -A rps
variants=(bare governor tollgate tollgate3)
for round in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    "${server_pin[@]}" "$bin" "$v" "$port" &
    pid=$!
    for _ in $(seq 50); do
      if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then break; fi
      sleep 0.1
    done
    out=$("${client_pin[@]}" wrk -t1 -c"$conns" -d"${secs}s" "http://127.0.0.1:$port/")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    non2xx=$(echo "$out" | awk '/Non-2xx/ {print $NF}')
    if [ -n "$non2xx" ]; then echo "$v: $non2xx non-2xx responses" >&2; fi
    # best of the rounds
    if [ -z "${rps[$v]:-}" ] || awk "BEGIN{exit !($r > ${rps[$v]})}"; then rps[$v]=$r; fi
  done
done

echo
echo "wrk -t1 -c$conns -d${secs}s, best of $rounds; server on one worker thread${server_pin:+, pinned to CPU 0 (wrk on CPU 1)}"
printf '%-32s %12s %8s %18s\n' "server" "requests/s" "x bare" "x tower_governor"
name() {
  case "$1" in
    bare) echo "bare axum (baseline)" ;;
    governor) echo "tower_governor, headers" ;;
    tollgate) echo "tollgate, 1 limit" ;;
    tollgate3) echo "tollgate, 3 limits" ;;
  esac
}
for v in "${variants[@]}"; do
  awk -v n="$(name "$v")" -v r="${rps[$v]}" -v b="${rps[bare]}" -v g="${rps[governor]}" \
    'BEGIN { printf "%-32s %12.0f %8.2f %18.2f\n", n, r, r / b, r / g }'
done
if [ -n "$svg" ]; then
  for v in "${variants[@]}"; do
    awk -v n="$(name "$v")" -v r="${rps[$v]}" -v b="${rps[bare]}" -v g="${rps[governor]}" \
      'BEGIN { printf "%s\t%.0f\t%.2f, %.2f\n", n, r, r / b, r / g }'
  done | "$bin" chart "$svg" "wrk -t1 -c$conns -d${secs}s, best of $rounds: requests per second"
fi
