# Alternating pairs for the benchmark scripts (sourced). A row that compares a tool with its
# limit runs the two alternately, PAIRS times (limit first in odd pairs, the tool first in even
# ones, so that neither always meets the machine right after the other), and prints one row
# through benches/pairs.py: both medians, the median of the per-pair ratios, their range and
# the target. Each measurement is a shell command printing its figure(s) on one line.
#
#   PAIRS      pairs per row (default 5; scripts set it from --pairs)
#   CSV        if set, every row is appended to this CSV file too (benches/plot.py reads it)
#
#   pairs_load start|end
#   pairs_header "op|block|threads" "tebench GB/s" "iperf3 GB/s" [--metric NAME,OURS,LIMIT]
#   pairs_row "read|64K|1" ">= 0.90" "ours command" "limit command" [csv label names]
#   pairs_grid ">= 0.90" ours_function limit_function

PAIRS=${PAIRS:-5}
PAIRS_PY="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/pairs.py"

pairs_load() { python3 "$PAIRS_PY" load "$1"; }

pairs_header() { python3 "$PAIRS_PY" header "$@"; }

pairs_row() { # labels target ours_cmd limit_cmd [columns]
  local labels=$1 target=$2 ours=$3 limit=$4 columns=${5:-} file i o l
  file=$(mktemp)
  for i in $(seq 1 "$PAIRS"); do
    if [ $((i % 2)) -eq 1 ]; then
      l=$(eval "$limit") || { echo "limit run failed: $limit" >&2; rm -f "$file"; return 1; }
      o=$(eval "$ours") || { echo "run failed: $ours" >&2; rm -f "$file"; return 1; }
    else
      o=$(eval "$ours") || { echo "run failed: $ours" >&2; rm -f "$file"; return 1; }
      l=$(eval "$limit") || { echo "limit run failed: $limit" >&2; rm -f "$file"; return 1; }
    fi
    if [ -z "$o" ] || [ -z "$l" ]; then
      echo "a run printed no figure ($labels, pair $i): '$o' '$l'" >&2; rm -f "$file"; return 1
    fi
    echo "  pair $i of $PAIRS, ${labels//|/ }: $o vs $l" >&2
    echo "$o;$l" >>"$file"
  done
  python3 "$PAIRS_PY" row "$labels" "$file" --target "$target" ${CSV:+--csv "$CSV"} ${columns:+--columns "$columns"}
  rm -f "$file"
}

pairs_grid() { # target ours_fn limit_fn: a row per op of OPS, block of BLOCKS, count of THREADS
  local target=$1 ours=$2 limit=$3 op block threads
  for op in $OPS; do
    for block in $BLOCKS; do
      for threads in $THREADS; do
        pairs_row "$op|$block|$threads" "$target" "$ours $op $block $threads" "$limit $op $block $threads" \
          "op|block|threads" || return 1
      done
    done
  done
}
