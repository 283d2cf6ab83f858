# The command line of the benchmark scripts (sourced, from the repository root). A script sets
# its defaults and BENCH_OPTIONS, the options it takes as "--name=VARIABLE" words, then calls
# `bench_args "$@"`: each `--name VALUE` sets VARIABLE to VALUE; a bare number sets the
# variable BENCH_NUMBER names (seconds per measurement, where the script takes them); -h or
# --help prints the script's header comment (up to `set -euo pipefail`) and exits. Anything
# else ends the script with status 2.

bench_args() {
  local opt
  while [ $# -gt 0 ]; do
    case $1 in
      -h | --help)
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        exit 0
        ;;
      [0-9]*)
        if [ -n "${BENCH_NUMBER:-}" ]; then
          printf -v "$BENCH_NUMBER" '%s' "$1"
          shift
          continue
        fi
        ;;
      --*)
        for opt in $BENCH_OPTIONS; do
          if [ "${opt%%=*}" = "$1" ]; then
            [ $# -ge 2 ] || { echo "$(basename "$0"): $1 takes a value" >&2; exit 2; }
            printf -v "${opt#*=}" '%s' "$2"
            shift 2
            continue 2
          fi
        done
        ;;
    esac
    echo "$(basename "$0"): unknown argument $1" >&2
    exit 2
  done
}
