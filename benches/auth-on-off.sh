#!/usr/bin/env bash
# The cost of the cluster secret (issue 26): `tebench auth-pair`, in one process, two engine
# pairs over tcp on loopback (one with the secret, one without) and two masters with a holder
# and a user client each, alternating 32 MiB engine transfers (read, write) and 8 MiB store
# put / get / get_into between the two sides in pairs. Authentication is once per connection,
# so the target is on/off >= 0.98. Prints both medians, the median per-pair ratio, its p5-p95
# range and a bootstrap 95 % CI per row, the handshake's added latency, and the load.
#
#   benches/auth-on-off.sh [--pairs N] [--no-build] [other tebench auth-pair flags...]
#   (default 200 pairs per row; `tebench auth-pair --help` lists the other flags:
#   --chunk, --block-size, --value-size, --connects, --resamples)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=1 ARGS=()
while [ $# -gt 0 ]; do
  case $1 in
    --no-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
if [ "$BUILD" = 1 ]; then
  echo "building (release)..." >&2
  cargo build --release -q -p crescent-benches --bin tebench
fi
BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
exec env -u CRESCENT_CLUSTER_SECRET_FILE -u CRESCENT_CLUSTER_SECRET_NEXT -u CRESCENT_CLUSTER_SECRET \
  "$BIN/tebench" auth-pair "${ARGS[@]}"
