#!/usr/bin/env bash
# The image: builds deploy/Containerfile.prebuilt (deploy/Containerfile's runtime stage) with
# Debian's podman over the binaries and wheels CI built already, on a Debian 12 base made here
# with mmdebstrap (no image registry is reachable from CI), then runs the manifests' pods as
# containers on a podman network of their own: the metadata server, the master and two
# standalone clients, each with deploy/k8s's command and arguments. Values are put through one
# client's container and got through the other's (each get from the container whose client
# does not hold the value, so the bytes cross between containers), compared byte for byte;
# the master's and a client's /metrics are scraped and checked, and the wheel is imported and
# used from the image's python3.
#
# Usage: ci/image.sh [BIN_DIR [WHEEL_DIR]]
#   BIN_DIR    the built binaries (default ${CARGO_TARGET_DIR:-target}/debug: ci/test.sh's build)
#   WHEEL_DIR  the wheels (default ci/.work/wheels, ci/ffi.sh's ci_python_wheel; built when absent)
# CRESCENT_IMAGE_KEEP=1 keeps the image, tagged localhost/crescent:VERSION and :latest.
#
# The base (a tarball, ~2 minutes to make) is cached under ci/.work/image/ and reused while
# its package list is the same; everything else it makes (containers, network, images) is
# removed at the end, also on failure. Names carry this process's id: several CI runs on one
# machine share podman's store. podman runs with `--runtime runc` and `default_ulimits = []`
# from a containers.conf of its own (CONTAINERS_CONF; /etc is not touched): Debian's default
# crun refuses hybrid cgroup hierarchies, and raising rlimits is not permitted on some CI
# machines.
set -euo pipefail
cd "$(dirname "$0")/.."
. ci/lib.sh

T0=$SECONDS
step_start=$SECONDS
timing() { printf '    (%s: %ds)\n' "$1" $((SECONDS - step_start)) >&2; step_start=$SECONDS; }

BIN_DIR="${1:-${CARGO_TARGET_DIR:-target}/debug}"
WHEEL_DIR="${2:-ci/.work/wheels}"
WORK=ci/.work/image
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
VERSION=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
# The binaries deploy/Containerfile installs (keep the two lists in step).
BINARIES=(crescent-master mooncake_master crescent-client mooncake_client crescent crescent-metadata-server
  tebench storebench)

ci_apt_install podman buildah runc mmdebstrap binutils

ID="crescent-ci-$$"
IMAGE="localhost/$ID"
BASE_IMAGE="localhost/$ID-base:bookworm"
NET="$ID"
CTX="$WORK/ctx-$$"
RUN_DIR="$WORK/run-$$"
# The base's packages: what the runtime stage needs (it installs them when a base lacks them).
# The tarball's name carries their hash, so a changed list makes a new base.
BASE_PACKAGES=libibverbs1,ibverbs-providers,ca-certificates,python3
BASE_TAR="$WORK/base-bookworm-$(echo "$BASE_PACKAGES" | sha256sum | cut -c1-12).tar"
export CONTAINERS_CONF="$WORK/containers.conf"
# Written whole, then renamed: a concurrent run reads the old file or the new one.
cat >"$CONTAINERS_CONF.$$" <<'EOF'
# ci/image.sh's podman settings (CONTAINERS_CONF): runc instead of crun, which refuses the
# hybrid cgroup hierarchy of some CI machines; no default rlimits, which podman would raise
# and such machines forbid.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
mv "$CONTAINERS_CONF.$$" "$CONTAINERS_CONF"

cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ]; then
    for c in $(podman ps -a --filter "name=^$ID-" --format '{{.Names}}' 2>/dev/null); do
      echo "---- last log lines of container $c" >&2
      podman logs --tail 30 "$c" >&2 2>&1
    done
  fi
  podman ps -a --filter "name=^$ID-" --format '{{.Names}}' 2>/dev/null | xargs -r podman rm -f -t 0 >/dev/null 2>&1
  podman network rm -f "$NET" >/dev/null 2>&1
  if [ "${CRESCENT_IMAGE_KEEP:-0}" != 1 ]; then
    podman rmi -f "$IMAGE:$VERSION" "$IMAGE:latest" >/dev/null 2>&1
  fi
  podman rmi -f "$BASE_IMAGE" >/dev/null 2>&1
  rm -rf "$CTX" "$RUN_DIR" "$BASE_TAR.$$.tmp"
  exit $rc
}
trap cleanup EXIT

# ---- the base: Debian 12 minbase with the run-time packages, as a tarball (cached) ----
if [ ! -s "$BASE_TAR" ]; then
  ci_log "image: making the Debian 12 base with mmdebstrap ($BASE_PACKAGES)"
  rm -f "$WORK"/base-bookworm-*.tar
  # Documentation, man pages and translations left out: the image needs none of them.
  nice -n 10 mmdebstrap --quiet --format=tar --variant=minbase --include="$BASE_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    bookworm "$BASE_TAR.$$.tmp" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  mv "$BASE_TAR.$$.tmp" "$BASE_TAR"
  timing "base made"
else
  ci_log "image: the Debian 12 base from the cache ($BASE_TAR)"
fi
podman import -q "$BASE_TAR" "$BASE_IMAGE" >/dev/null
timing "base imported as $BASE_IMAGE"
# A machine where podman cannot start any container (a kernel or cgroup feature missing) still
# builds and inspects the image; the runs are skipped there, said loudly, without failing CI.
if ! probe=$(podman run --rm "$BASE_IMAGE" true 2>&1); then
  CAN_RUN=0
  ci_log "image: podman cannot run a container here (runtime runc, default_ulimits = []): $probe"
  echo "image: the image is built and inspected only; its containers are not run" >&2
else
  CAN_RUN=1
fi

# ---- the context: the binaries (debug info stripped) and the wheels ----
ci_log "image: building $IMAGE:$VERSION from deploy/Containerfile.prebuilt"
runtime_stage() { sed -n '/^# ---- runtime stage/,$p' "$1"; }
if ! diff <(runtime_stage deploy/Containerfile) <(runtime_stage deploy/Containerfile.prebuilt) >&2; then
  echo "image: the runtime stages of deploy/Containerfile and deploy/Containerfile.prebuilt differ (above)" >&2
  exit 1
fi
if ! ls "$WHEEL_DIR"/crescent-[0-9]*.whl >/dev/null 2>&1; then
  . ci/ffi.sh
  ci_python_env
  ci_python_wheel debug
  WHEEL_DIR=ci/.work/wheels
fi
mkdir -p "$CTX/bin" "$CTX/wheels" "$RUN_DIR"
for b in "${BINARIES[@]}"; do
  [ -x "$BIN_DIR/$b" ] || { echo "image: $BIN_DIR/$b is missing (cargo build --workspace first)" >&2; exit 1; }
  strip --strip-debug -o "$CTX/bin/$b" "$BIN_DIR/$b"
done
cp "$WHEEL_DIR"/crescent-[0-9]*.whl "$WHEEL_DIR"/crescent_mooncake-*.whl "$CTX/wheels/"
timing "context staged"
podman build -q --layers=false -f deploy/Containerfile.prebuilt --build-arg RUNTIME_IMAGE="$BASE_IMAGE" \
  -t "$IMAGE:$VERSION" -t "$IMAGE:latest" "$CTX" >/dev/null
podman image inspect --format '{{.Id}} {{.Size}}' "$IMAGE:$VERSION" |
  awk '{printf "image %s: %.0f MiB\n", substr($1, 1, 12), $2 / 1048576}'
for tag in "$VERSION" latest; do podman image exists "$IMAGE:$tag"; done
if [ "$CAN_RUN" = 0 ]; then
  podman image inspect --format '{{.Config.Cmd}} {{.Config.ExposedPorts}}' "$IMAGE:$VERSION"
  ci_log "image: built and inspected in $((SECONDS - T0)) s; NOT run: podman cannot start containers here"
  exit 0
fi
# Every binary starts in the image, and libibverbs is there for the rdma transport to load.
podman run --rm "$IMAGE:$VERSION" sh -c 'for b in "$@"; do "$b" --help >/dev/null || exit 1; done
  ldconfig -p | grep -q "libibverbs.so.1 " || { echo "no libibverbs.so.1 in the image" >&2; exit 1; }
  ls /usr/lib/x86_64-linux-gnu/libibverbs/ | grep -q rxe || { echo "no verbs providers" >&2; exit 1; }' \
  sh "${BINARIES[@]}"
echo "image: ${#BINARIES[@]} binaries run (--help), libibverbs.so.1 and its providers present"
timing "image built"

# ---- the manifests' pods as containers ----
# Each container runs the command and arguments of its deploy/k8s manifest (read with the
# PyYAML of ci/k8s-validate.sh's venv), the environment of config.yaml's ConfigMap with this
# network's addresses and a small pool.
[ -x .venv-k8s/bin/python ] || bash ci/k8s-validate.sh >/dev/null
manifest_argv() {
  .venv-k8s/bin/python - "$1" "$2" <<'EOF'
import sys, yaml
path, kind = sys.argv[1], sys.argv[2]
for doc in yaml.safe_load_all(open(path)):
    if doc and doc["kind"] == kind:
        c = doc["spec"]["template"]["spec"]["containers"][0]
        print("\n".join(c.get("command", []) + c.get("args", [])))
        break
else:
    sys.exit(f"{path}: no {kind}")
EOF
}
config_env() {
  .venv-k8s/bin/python - deploy/k8s/config.yaml <<'EOF'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
for k, v in doc["data"].items():
    print(f"{k}={v}")
EOF
}
ip_of() { podman inspect -f "{{(index .NetworkSettings.Networks \"$NET\").IPAddress}}" "$1"; }
# Waits until container $1's log has a line starting with $2; prints the rest of that line.
wait_line() {
  local c=$1 prefix=$2 line
  for _ in $(seq 300); do
    line=$(podman logs "$c" 2>/dev/null | sed -n "s|^$prefix||p" | head -1)
    [ -n "$line" ] && { echo "$line"; return 0; }
    [ "$(podman inspect -f '{{.State.Running}}' "$c")" = true ] || break
    sleep 0.1
  done
  echo "image: container $c did not print '$prefix'" >&2
  return 1
}

ci_log "image: the metadata server, the master and two clients as containers on network $NET"
podman network create "$NET" >/dev/null
mapfile -t meta_argv < <(manifest_argv deploy/k8s/metadata-server.yaml Deployment)
mapfile -t master_argv < <(manifest_argv deploy/k8s/master.yaml StatefulSet)
mapfile -t client_argv < <(manifest_argv deploy/k8s/client-daemonset.yaml DaemonSet)
for argv in meta_argv master_argv client_argv; do
  declare -n a=$argv
  [ ${#a[@]} -gt 0 ] || { echo "image: no command read from deploy/k8s for $argv" >&2; exit 1; }
done
podman run -d -q --name "$ID-metadata" --network "$NET" "$IMAGE:$VERSION" "${meta_argv[@]}" >/dev/null
podman run -d -q --name "$ID-master" --network "$NET" "$IMAGE:$VERSION" "${master_argv[@]}" >/dev/null
wait_line "$ID-master" "master: " >/dev/null
MASTER="$(ip_of "$ID-master"):50051"
META="http://$(ip_of "$ID-metadata"):8080/metadata"
echo "master ${master_argv[*]} at $MASTER; metadata server at $META"
env_args=()
while IFS= read -r kv; do
  case "$kv" in
    MOONCAKE_MASTER=*) kv="MOONCAKE_MASTER=$MASTER" ;;
    MOONCAKE_TE_META_DATA_SERVER=*) kv="MOONCAKE_TE_META_DATA_SERVER=$META" ;;
    MOONCAKE_GLOBAL_SEGMENT_SIZE=*) kv="MOONCAKE_GLOBAL_SEGMENT_SIZE=64mb" ;;
    MOONCAKE_LOCAL_BUFFER_SIZE=*) kv="MOONCAKE_LOCAL_BUFFER_SIZE=32mb" ;;
  esac
  env_args+=(-e "$kv")
done < <(config_env)
declare -A SEGMENT_OF CONTAINER_OF
for c in a b; do
  # The manifest's MOONCAKE_LOCAL_HOSTNAME is the node's address: here, the container's own,
  # found by the client itself.
  podman run -d -q --name "$ID-client-$c" --network "$NET" "${env_args[@]}" \
    "$IMAGE:$VERSION" "${client_argv[@]}" >/dev/null
done
for c in a b; do
  SEGMENT_OF[$c]=$(wait_line "$ID-client-$c" "segment: ")
  CONTAINER_OF[${SEGMENT_OF[$c]}]=$c
  echo "client $c (${client_argv[*]}): segment ${SEGMENT_OF[$c]}"
done
timing "containers started"

# ---- put through one client's container, get through the other's ----
ci_log "image: put and get between the containers"
tool() { local c=$1; shift; podman exec -i "$ID-client-$c" crescent "$@" --master "$MASTER"; }
sizes=(1048576 4194304 9437184 65536)
crossed=0
for i in "${!sizes[@]}"; do
  key="ci/image/value-$i"
  from=$([ $((i % 2)) -eq 0 ] && echo a || echo b)
  head -c "${sizes[$i]}" /dev/urandom >"$RUN_DIR/in-$i"
  tool "$from" put "$key" - <"$RUN_DIR/in-$i"
  holder=$(tool "$from" stat "$key" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["replicas"][0]["segment"])')
  holder_c=${CONTAINER_OF[$holder]:-}
  [ -n "$holder_c" ] || { echo "image: $key is held by $holder, not a client's segment" >&2; exit 1; }
  reader=$([ "$holder_c" = a ] && echo b || echo a)
  tool "$reader" get "$key" >"$RUN_DIR/out-$i"
  cmp "$RUN_DIR/in-$i" "$RUN_DIR/out-$i"
  [ "$from" != "$holder_c" ] && crossed=$((crossed + 1))
  echo "$key (${sizes[$i]} bytes): put through $from, held by $holder_c, got through $reader: bytes equal"
done
echo "$crossed of ${#sizes[@]} puts stored in the other container; every get crossed between containers"
timing "put/get"

# ---- /metrics of the master and of a client; the wheel from the image's python3 ----
ci_log "image: the master's and a client's /metrics; the wheel"
scrape() { podman exec "$ID-client-a" python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())' "$1"; }
scrape "http://${MASTER%:*}:9003/metrics" >"$RUN_DIR/master.prom"
scrape "http://$(ip_of "$ID-client-a"):9300/metrics" >"$RUN_DIR/client.prom"
# value of series $2 (exact name and labels) in file $1
series() { awk -v s="$2" '$1 == s { print $2; found = 1 } END { exit !found }' "$1"; }
check() {
  local file=$1 name=$2 min=$3 v
  v=$(series "$file" "$name") || { echo "image: $(basename "$file") has no series $name" >&2; exit 1; }
  python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$v" "$min" ||
    { echo "image: $(basename "$file"): $name is $v, expected at least $min" >&2; exit 1; }
  echo "$(basename "$file" .prom) $name = $v"
}
n=${#sizes[@]}
check "$RUN_DIR/master.prom" master_key_count "$n"
check "$RUN_DIR/master.prom" master_active_clients 2
check "$RUN_DIR/master.prom" master_put_start_requests_total "$n"
check "$RUN_DIR/master.prom" crescent_master_is_leader 1
grep -q '^crescent_client_' "$RUN_DIR/client.prom" ||
  { echo "image: client a's /metrics has no crescent_client_ series" >&2; exit 1; }
echo "client /metrics: $(grep -c '^crescent_client_' "$RUN_DIR/client.prom") crescent_client_ samples"
# A worker's use of the wheel (as in deploy/k8s/client-daemonset.yaml): the image's python3
# attaches to client a as a dummy client and gets a value through it.
podman exec "$ID-client-a" python3 -c '
import hashlib, crescent
from crescent.store import MooncakeDistributedStore
s = MooncakeDistributedStore()
rc = s.setup_dummy(16 << 20, 16 << 20, "127.0.0.1:50052")
assert rc == 0, rc
print(hashlib.sha256(s.get("ci/image/value-2")).hexdigest())
s.close()
' >"$RUN_DIR/py.sha"
[ "$(cat "$RUN_DIR/py.sha")" = "$(sha256sum <"$RUN_DIR/in-2" | cut -d" " -f1)" ] ||
  { echo "image: the wheel's get through client a's setup_dummy read other bytes" >&2; exit 1; }
echo "the image's python3: setup_dummy on client a, get ci/image/value-2: bytes equal"
timing "metrics and wheel"

ci_log "image: passed in $((SECONDS - T0)) s (image $IMAGE:$VERSION, removed now unless CRESCENT_IMAGE_KEEP=1)"
if [ "${CRESCENT_IMAGE_KEEP:-0}" = 1 ]; then
  podman tag "$IMAGE:$VERSION" "localhost/crescent:$VERSION" "localhost/crescent:latest"
  podman rmi "$IMAGE:$VERSION" "$IMAGE:latest" >/dev/null
  echo "kept as localhost/crescent:$VERSION and localhost/crescent:latest"
fi
