#!/usr/bin/env bash
# redis-server for smlt's tests and benchmarks.
#   scripts/redis.sh install          install redis-server with apt if it is missing (idempotent)
#   scripts/redis.sh start [PORT]     start one on 127.0.0.1:PORT (default 6399), no persistence;
#                                     prints its URL; pid file in ${SMLT_REDIS_DIR:-/tmp/smlt-redis-PORT}
#   scripts/redis.sh stop [PORT]      stop the one started by `start` (by its pid file only)
#   scripts/redis.sh url [PORT]       print redis://127.0.0.1:PORT/0
# The pytest fixtures and bench/ start their own server on a free port; `start`/`stop` are for
# working by hand and for CI steps that want one shared server.
set -euo pipefail

cmd=${1:-install}
port=${2:-6399}
dir=${SMLT_REDIS_DIR:-/tmp/smlt-redis-$port}

find_bin() {
  command -v redis-server 2>/dev/null && return 0
  for p in /usr/bin/redis-server /usr/sbin/redis-server /usr/local/bin/redis-server; do
    [[ -x $p ]] && { echo "$p"; return 0; }
  done
  return 1
}

case $cmd in
  install)
    if bin=$(find_bin); then
      echo "redis-server present: $bin ($("$bin" --version | cut -d' ' -f3))"
      exit 0
    fi
    sudo=""
    [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    # Install without starting the distribution's service (no init system in CI anyway).
    $sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
    $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends redis-server >/dev/null
    # Debian's package may start a system-wide server where an init system exists; we never use it.
    bin=$(find_bin) || { echo "redis-server still missing after apt-get install" >&2; exit 1; }
    echo "redis-server installed: $bin"
    ;;
  start)
    bin=$(find_bin) || { echo "redis-server missing: run scripts/redis.sh install" >&2; exit 1; }
    mkdir -p "$dir"
    if [[ -f $dir/redis.pid ]] && kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null; then
      echo "redis://127.0.0.1:$port/0"; exit 0
    fi
    "$bin" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --protected-mode no \
      --dir "$dir" --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" \
      --proto-max-bulk-len 1gb --loglevel warning
    for _ in $(seq 100); do
      if [[ -f $dir/redis.pid ]] && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "redis://127.0.0.1:$port/0"; exit 0
      fi
      sleep 0.05
    done
    echo "redis-server did not start on port $port (log: $dir/redis.log)" >&2; exit 1
    ;;
  stop)
    if [[ -f $dir/redis.pid ]]; then
      pid=$(cat "$dir/redis.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
      rm -f "$dir/redis.pid"
    fi
    ;;
  url)
    echo "redis://127.0.0.1:$port/0"
    ;;
  *)
    echo "usage: $0 install | start [PORT] | stop [PORT] | url [PORT]" >&2; exit 2
    ;;
esac
