#!/usr/bin/env bash
# Sharded tensors against the batch calls of the same bytes (issue 45: "sharding adds no copy").
#
#   benches/tensor-tp.sh [--pairs N] [--size 256M] [--shards 8] [--rounds 3]
#
# Starts a crescent-master (2 s read lease: a 256 MiB batch read may pass 0.5 s on a busy
# machine) and a holder process with a 1 GiB segment, then per pair one reader process without a segment
# (benches/vs-mooncake-store.py tensor, through `mooncake.store` of Crescent's venv) that runs
# --rounds rounds of: `put_tensor_with_tp` of a --size float32 tensor in --shards shards along
# dim 0 and `batch_put_from` of the same bytes (a 304-byte header and a shard per key, from
# registered memory); `get_tensor_with_tp` of every rank, `batch_get_into` of the baseline's
# keys into registered memory, and one `batch_get_into` per key (a call per shard, as the
# sharded get makes); in alternating order. Prints a row per direction through
# benches/pairs.py: both medians (MiB/s), the median of the per-pair ratios tensor / batch and
# their range, against the target >= 0.90; and a third row, the sharded get against a
# batch_get_into per key.
#
#   BIN_DIR=DIR   use DIR's crescent-master instead of building it (release)
#   PYTHON=PATH   the interpreter with Crescent's wheel (default .venv/bin/python; ci/ffi.sh
#                 builds the release wheel there)
set -euo pipefail
cd "$(dirname "$0")/.."
PAIRS=5 SIZE=256M SHARDS=8 ROUNDS=3
. benches/lib-args.sh
BENCH_OPTIONS="--pairs=PAIRS --size=SIZE --shards=SHARDS --rounds=ROUNDS" BENCH_NUMBER=
bench_args "$@"
CPY=${PYTHON:-.venv/bin/python}
die() { echo "tensor-tp.sh: $*" >&2; exit 1; }
if [ -n "${BIN_DIR:-}" ]; then
  BIN=$BIN_DIR
else
  cargo build --release -q -p crescent-store || die "cargo build failed"
  BIN=${CARGO_TARGET_DIR:-$PWD/target}/release
fi
[ -x "$BIN/crescent-master" ] || die "$BIN/crescent-master is missing"
"$CPY" -c 'import crescent, numpy' 2>/dev/null || die "$CPY cannot import crescent and numpy (ci/ffi.sh's release wheel)"

PIDS=()
WORK=$(mktemp -d)
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
"$BIN/crescent-master" --rpc_address=127.0.0.1 --rpc_port="$PORT" --metrics_host=127.0.0.1 \
  --metrics_port="$(free_port)" --default_kv_lease_ttl=2000 >"$WORK/master.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$PORT" 2>/dev/null && break; sleep 0.1; done
"$CPY" benches/vs-mooncake-store.py holder --master "127.0.0.1:$PORT" >"$WORK/holder.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 300); do grep -q '^ready ' "$WORK/holder.log" 2>/dev/null && break; sleep 0.1; done
grep -q '^ready ' "$WORK/holder.log" || { tail -n 5 "$WORK/holder.log" >&2; die "the holder did not start"; }

python3 benches/pairs.py load start
for i in $(seq 1 "$PAIRS"); do
  "$CPY" benches/vs-mooncake-store.py tensor --master "127.0.0.1:$PORT" --size "$SIZE" --shards "$SHARDS" \
    --rounds "$ROUNDS" >"$WORK/out" 2>"$WORK/reader.log" || { tail -n 8 "$WORK/reader.log" >&2; die "pair $i failed"; }
  read -r tp_put batch_put tp_get batch_get key_get <"$WORK/out"
  echo "  pair $i of $PAIRS (MiB/s): put_tensor_with_tp $tp_put, batch_put_from $batch_put; get_tensor_with_tp $tp_get, batch_get_into $batch_get, per key $key_get" >&2
  echo "$tp_put $batch_put" >>"$WORK/put"
  echo "$tp_get $batch_get" >>"$WORK/get"
  echo "$tp_get $key_get" >>"$WORK/keyget"
done
python3 benches/pairs.py header "op|tensor|shards" "sharded MiB/s" "batch MiB/s"
python3 benches/pairs.py row "put_tensor_with_tp / batch_put_from|$SIZE|$SHARDS" "$WORK/put" --target '>=0.90'
python3 benches/pairs.py row "get_tensor_with_tp / batch_get_into|$SIZE|$SHARDS" "$WORK/get" --target '>=0.90'
# Not the issue's row: the same calls on both sides (a shard per call), which tells the cost of
# the sharded form itself from that of making a call per shard.
python3 benches/pairs.py row "get_tensor_with_tp / batch_get_into per key|$SIZE|$SHARDS" "$WORK/keyget" --target '>=0.90'
python3 benches/pairs.py load end
