#!/usr/bin/env bash
# Python `get` (bytes) beside `get_into` (registered memory) between two hosts: network
# namespaces joined by a veth pair, as benches/storebench.sh makes them.
#
#   benches/py-byteget.sh [--pairs 30] [--sizes 1M,10M,25M]
#
# Host A runs crescent-master and a holder client (`crescent client`, 2 GiB segment); host B
# runs benches/py-byteget.py (the `crescent` package, in $PYTHON, default .venv/bin/python),
# whose puts land in A's memory, so every get crosses the link. Each pair times one get and one
# get_into of the same value; the table gives the medians and the median of the per-pair
# ratios (target >= 0.85, issue 28 §2), with the load average at start and end. Needs root,
# the release binaries (built here) and a release wheel of ffi/python installed in $PYTHON
# (`maturin build --release -m ffi/python/Cargo.toml`, then pip install).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "py-byteget.sh needs root (network namespaces)" >&2; exit 1; }
PYTHON=${PYTHON:-.venv/bin/python}
"$PYTHON" -c 'import crescent' || { echo "$PYTHON cannot import crescent: install the wheel" >&2; exit 1; }
. benches/lib-netns.sh
bench_hosts_up crescent-store
bench_store_up
printf '%s, py-byteget: Python get vs get_into over tcp between two network namespaces\n' "$(date -u '+%F %H:%M UTC')"
ip netns exec "$NS_B" "$PYTHON" benches/py-byteget.py --master "$MASTER" --local-hostname "$ADDR_B" "$@" 2>"$WORK/py.err" ||
  { cat "$WORK/py.err" >&2; exit 1; }
