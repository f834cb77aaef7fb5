#!/usr/bin/env bash
# Every combination of the crate's features (read from Cargo.toml, `default` aside) builds
# without a warning: the library alone, each feature on its own, every pair, ..., all of them.
# The tests, examples and benches are linted with every feature by clippy in `.ci/run`.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t features < <(awk '
  /^\[features\]/ { on = 1; next }
  /^\[/ { on = 0 }
  on && /^[a-z0-9_-]+ *=/ { sub(/ *=.*/, ""); if ($0 != "default") print }
' Cargo.toml)
if [ "${#features[@]}" -eq 0 ]; then
  echo "no features found in Cargo.toml" >&2
  exit 1
fi

combinations=$((1 << ${#features[@]}))
echo "checking the ${combinations} combinations of: ${features[*]}"
for ((mask = 0; mask < combinations; mask++)); do
  chosen=()
  for i in "${!features[@]}"; do
    if (((mask >> i) & 1)); then chosen+=("${features[i]}"); fi
  done
  list=$(IFS=,; echo "${chosen[*]}")
  if ! RUSTFLAGS="-D warnings" cargo check --quiet --no-default-features --features "$list"; then
    echo "the features [${list}] do not build without warnings" >&2
    exit 1
  fi
done
