# Metadata services for the tests (sourced, not run): etcd and redis from Debian's packages on
# loopback ports chosen here, exported as CRESCENT_TEST_ETCD / CRESCENT_TEST_REDIS
# (127.0.0.1:PORT), stopped by ci_stop_services (test.sh sets it as the EXIT trap).

CI_SERVICE_PACKAGES=(etcd-server redis-server)
CI_SERVICE_PIDS=()
CI_SERVICE_DIR=""

ci_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until something accepts connections on 127.0.0.1:$1 (at most $2 seconds).
ci_wait_port() {
  local port=$1 tries=$(( $2 * 10 ))
  while [ "$tries" -gt 0 ]; do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
    tries=$(( tries - 1 ))
  done
  return 1
}

ci_start_services() {
  CI_SERVICE_DIR=$(mktemp -d /tmp/crescent-ci-services.XXXXXX)
  local etcd_port etcd_peer redis_port
  etcd_port=$(ci_free_port)
  etcd_peer=$(ci_free_port)
  redis_port=$(ci_free_port)

  ci_log "starting etcd on 127.0.0.1:$etcd_port and redis on 127.0.0.1:$redis_port"
  etcd --name crescent-ci --data-dir "$CI_SERVICE_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" \
    --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "crescent-ci=http://127.0.0.1:$etcd_peer" \
    >"$CI_SERVICE_DIR/etcd.log" 2>&1 &
  CI_SERVICE_PIDS+=($!)
  redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no \
    --dir "$CI_SERVICE_DIR" >"$CI_SERVICE_DIR/redis.log" 2>&1 &
  CI_SERVICE_PIDS+=($!)

  if ! ci_wait_port "$etcd_port" 30; then
    cat "$CI_SERVICE_DIR/etcd.log" >&2
    ci_log "etcd did not start"
    return 1
  fi
  if ! ci_wait_port "$redis_port" 30; then
    cat "$CI_SERVICE_DIR/redis.log" >&2
    ci_log "redis did not start"
    return 1
  fi
  export CRESCENT_TEST_ETCD="127.0.0.1:$etcd_port"
  export CRESCENT_TEST_REDIS="127.0.0.1:$redis_port"
}

ci_stop_services() {
  local pid
  for pid in "${CI_SERVICE_PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${CI_SERVICE_PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  CI_SERVICE_PIDS=()
  [ -n "$CI_SERVICE_DIR" ] && rm -rf "$CI_SERVICE_DIR"
  CI_SERVICE_DIR=""
}
