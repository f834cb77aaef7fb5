#!/usr/bin/env bash
# Requests per second of an axum hello-world server, bare, behind tower_governor and behind
# tollgate's RateLimitLayer (memory store, 1 and 3 limits, headers on), under wrk with fixed
# connections. Builds benches/http_server.rs (bench profile), installs Debian's wrk and curl
# when they are missing, runs each server on a free loopback port, pins the server to CPU 0
# and wrk to CPU 1 when taskset exists, and prints the table with ratios to bare axum and to
# tower_governor. A server that does not start, or a run with socket errors or responses
# other than 2xx (a limit reached: the run would measure refusals), stops the script.
#
# scripts/bench-http.sh [SECONDS (default 10)] [CONNECTIONS (default 64)] [ROUNDS (default 1)]
#                       [SVG (a file to draw the table into as a bar chart)]
#
# HTTP_SERVER_BIN=path runs that build of the server instead of building one (to compare two
# builds on the same machine state).
#
# scripts/bench-http.sh --instructions [SECONDS (default 5)] [CONNECTIONS (default 1)] [SVG]
#   counts instead the instructions each server runs per request under the same load, and
#   the misses of a simulated instruction cache (callgrind's `--cache-sim`, of the size of
#   this machine's): each server runs under valgrind's callgrind (installed from Debian's
#   package when missing), takes a second of wrk's requests to warm up, then its counts are
#   zeroed and it serves SECONDS of requests; the table is its counts divided by the
#   requests wrk made.
#   Counts do not depend on what else the machine is doing, so two builds, or two layers,
#   compare on a shared machine where requests per second move by a tenth from run to run.
#   With one connection every request is one wakeup of the server, and a server's count
#   repeats within a few instructions a request; with more, how many requests a wakeup
#   serves varies from run to run, and the count by about 1%. Builds of other code differ
#   in what bare axum itself takes (by about 100): compare them by the "over bare" column.
#   (Under valgrind a server runs some fifty times slower: the requests are fewer, not the
#   instructions each takes.)
set -euo pipefail
cd "$(dirname "$0")/.."
instructions=""
if [ "${1:-}" = "--instructions" ]; then
  instructions=1
  shift
  set -- "${1:-5}" "${2:-1}" 1 "${3:-}"
fi
secs="${1:-10}"
conns="${2:-64}"
rounds="${3:-1}"
svg="${4:-}"

# installs Debian's package $2 when command $1 is missing
need() {
  if ! command -v "$1" >/dev/null 2>&1; then
    echo "$1 not found; installing Debian's package $2" >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "$2" >/dev/null
  fi
}
need wrk wrk
need curl curl
if [ -n "$instructions" ]; then need valgrind valgrind; fi

# the server running, stopped however the script ends
pid=""
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi' EXIT

# a loopback port nothing listens on (bash's /dev/tcp connects when something does), below
# Linux's ephemeral ports (32768 and up), which connections take as they are made
free_port() {
  local p
  while true; do
    p=$((20000 + RANDOM % 12000))
    if ! (: <"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

# waits until the server $1 (pid $2, on $port) answers, for up to $3 tenths of a second;
# stops the script if it exits or never answers
await_server() {
  for _ in $(seq "$3"); do
    if curl -s -o /dev/null "http://127.0.0.1:$port/" 2>/dev/null; then
      kill -0 "$2" 2>/dev/null && return
      break
    fi
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "$1: the server did not start on port $port" >&2
  exit 1
}

# stops the script when wrk's output $2 (of server $1) tells of socket errors or of
# responses other than 2xx
check_run() {
  local errors non2xx
  errors=$(echo "$2" | awk '/Socket errors/ {print}')
  non2xx=$(echo "$2" | awk '/Non-2xx/ {print $NF}')
  if [ -n "$errors" ] || [ -n "$non2xx" ]; then
    echo "$1: ${errors:-}${non2xx:+ $non2xx non-2xx responses}; the run measures no served requests" >&2
    exit 1
  fi
}

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
name() {
  case "$1" in
    bare) echo "bare axum (baseline)" ;;
    governor) echo "tower_governor, headers" ;;
    tollgate) echo "tollgate, 1 limit" ;;
    tollgate3) echo "tollgate, 3 limits" ;;
  esac
}

if [ -n "$instructions" ]; then
  declare -A per miss
  out_dir=$(mktemp -d)
  pid=""
  trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; fi; rm -rf "$out_dir"' EXIT
  for v in "${variants[@]}"; do
    port=$(free_port)
    valgrind --tool=callgrind --cache-sim=yes --callgrind-out-file="$out_dir/$v.%p" \
      "$bin" "$v" "$port" >/dev/null 2>&1 &
    pid=$!
    await_server "$v" "$pid" 300
    # (under valgrind a server answers some fifty times slower than wrk's 2 s timeout allows
    # with many connections)
    wrk -t1 -c"$conns" -d1s --timeout 60s "http://127.0.0.1:$port/" >/dev/null
    callgrind_control -z "$pid" >/dev/null
    out=$(wrk -t1 -c"$conns" -d"${secs}s" --timeout 60s "http://127.0.0.1:$port/")
    callgrind_control -d "$pid" >/dev/null
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    check_run "$v" "$out"
    requests=$(echo "$out" | awk '/requests in/ {print $1}')
    # the dump made after the zeroing (the first of the run's numbered parts)
    dump="$out_dir/$v.$pid.1"
    read -r total misses < <(callgrind_annotate --show=Ir,I1mr "$dump" 2>/dev/null |
      awk '/PROGRAM TOTALS/ {gsub(",", ""); print $1, $3}') || true
    if [ -z "$requests" ] || [ -z "${misses:-}" ] || [ "$requests" -eq 0 ]; then
      echo "$v: no count (requests: ${requests:-none})" >&2
      exit 1
    fi
    per[$v]=$((total / requests))
    miss[$v]=$((misses / requests))
    icache=$(sed -n 's/^desc: I1 cache: //p' "$dump")
  done
  echo
  echo "instructions per request (callgrind), wrk -t1 -c$conns -d${secs}s; server on one worker thread"
  echo "I1 misses: of a simulated instruction cache of $icache"
  printf '%-32s %12s %12s %10s %8s %18s\n' \
    "server" "instr/req" "over bare" "I1 misses" "x bare" "x tower_governor"
  for v in "${variants[@]}"; do
    awk -v n="$(name "$v")" -v r="${per[$v]}" -v b="${per[bare]}" -v g="${per[governor]}" \
      -v m="${miss[$v]}" \
      'BEGIN { printf "%-32s %12d %12d %10d %8.2f %18.2f\n", n, r, r - b, m, b / r, g / r }'
  done
  echo "(x bare, x tower_governor: the other's instructions over this one's, so that higher is"
  echo " better, as in the requests-per-second table)"
  if [ -n "$svg" ]; then
    for v in "${variants[@]}"; do
      awk -v n="$(name "$v")" -v r="${per[$v]}" -v b="${per[bare]}" -v g="${per[governor]}" \
        'BEGIN { printf "%s\t%d\t%.2f, %.2f\n", n, r, b / r, g / r }'
    done | "$bin" chart "$svg" "callgrind, wrk -t1 -c$conns -d${secs}s: instructions per request" instr
  fi
  exit 0
fi
for round in $(seq "$rounds"); do
  for v in "${variants[@]}"; do
    port=$(free_port)
    "${server_pin[@]}" "$bin" "$v" "$port" &
    pid=$!
    await_server "$v" "$pid" 50
    out=$("${client_pin[@]}" wrk -t1 -c"$conns" -d"${secs}s" "http://127.0.0.1:$port/")
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    check_run "$v" "$out"
    r=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    # best of the rounds
    if [ -z "${rps[$v]:-}" ] || awk "BEGIN{exit !($r > ${rps[$v]})}"; then rps[$v]=$r; fi
  done
done

echo
echo "wrk -t1 -c$conns -d${secs}s, best of $rounds; server on one worker thread${server_pin:+, pinned to CPU 0 (wrk on CPU 1)}"
printf '%-32s %12s %8s %18s\n' "server" "requests/s" "x bare" "x tower_governor"
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
