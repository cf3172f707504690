#!/usr/bin/env bash
# A real Docker Engine, a plain-HTTP registry on loopback and a Debian base image of our own,
# for the launcher's image tests (build, push, inspect, run, squash). Nothing is pulled from a
# public registry: none is reachable here, so the base image is made with debootstrap from
# Debian's package mirror and imported (cached between runs on the same machine).
#
# usage: scripts/docker-local.sh start|stop|status|env|clean-tests [NAME]
#   start   install the Debian packages if missing (root + apt), start dockerd unless one answers
#           on the socket, start the registry, make or reuse the base image. Idempotent.
#   stop    stop the registry and the dockerd this script started (by their recorded pids);
#           the engine's data (images, the build cache) stays for the next start.
#   status  exit 1 unless the engine and the registry answer.
#   clean-tests
#           remove what the test suite leaves behind: images tagged scdino-e2e (local and in the
#           registry), untagged build layers, and the registry's scdino-e2e repositories (blobs
#           garbage-collected; the registry is stopped for that). Each full test run builds about 3 GB of images; without this a
#           machine that runs the tests repeatedly fills its disk. The base image stays.
#           With NAME, the same for images and repositories named NAME instead of scdino-e2e
#           (scripts/gpu-image.sh removes its own that way, leaving the tests' alone).
#   env     the line to eval so that tests find them:  eval "$(scripts/docker-local.sh env)"
# State (pids, logs, registry root, the cached rootfs tarball) lives in $SCDINO_DOCKER_DIR
# (default /var/tmp/scdino-docker). Registry port: $SCDINO_REGISTRY_PORT (default 5555).
# Base image name: $SCDINO_BASE_IMAGE (default scdino-base:bookworm).
set -euo pipefail
S=$(realpath -m "${SCDINO_DOCKER_DIR:-/var/tmp/scdino-docker}")
PORT=${SCDINO_REGISTRY_PORT:-5555}
BASE=${SCDINO_BASE_IMAGE:-scdino-base:bookworm}
SOCK=/var/run/docker.sock
MIRROR=${SCDINO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
log() { printf '[docker-local] %s\n' "$*" >&2; }

alive() {
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  [[ $s != Z* ]]
}
pid_of() { cat "$1" 2>/dev/null || true; }
engine_up() { curl -sf --unix-socket "$SOCK" http://localhost/_ping >/dev/null 2>&1; }
registry_up() { curl -sf "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1; }

install_packages() {
  local missing=() bin pkg
  for pair in dockerd:docker.io docker-registry:docker-registry debootstrap:debootstrap \
    mksquashfs:squashfs-tools unsquashfs:squashfs-tools curl:curl; do
    bin=${pair%%:*} pkg=${pair#*:}
    command -v "$bin" >/dev/null 2>&1 || [[ -x /usr/sbin/$bin ]] || missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -ne 0 ]]; then
    log "missing packages: ${missing[*]}; run as root or: apt-get install ${missing[*]}"
    exit 1
  fi
  log "installing ${missing[*]} (apt-get, about 30 s)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

start_engine() {
  if engine_up; then
    log "engine already answering on $SOCK"
    return 0
  fi
  mkdir -p "$S"/log
  log "starting dockerd (log $S/log/dockerd.log)"
  # No iptables and no bridge: this sandbox allows neither; containers use --network none or
  # host networking, which is all the tests and builds need.
  setsid /usr/sbin/dockerd --iptables=false --ip6tables=false --bridge=none \
    --pidfile "$S"/dockerd.pid >"$S"/log/dockerd.log 2>&1 </dev/null &
  local i
  for i in $(seq 1 300); do
    engine_up && return 0
    sleep 0.1
  done
  log "dockerd did not answer within 30 s:"
  tail -n 20 "$S"/log/dockerd.log >&2 || true
  exit 1
}

start_registry() {
  if registry_up; then
    log "registry already answering on 127.0.0.1:$PORT"
    return 0
  fi
  mkdir -p "$S"/registry "$S"/log
  cat >"$S"/registry.yml <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $S/registry
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$PORT
EOF
  log "starting docker-registry on 127.0.0.1:$PORT (root $S/registry)"
  setsid docker-registry serve "$S"/registry.yml >"$S"/log/registry.log 2>&1 </dev/null &
  echo $! >"$S"/registry.pid
  local i
  for i in $(seq 1 100); do
    registry_up && return 0
    sleep 0.1
  done
  log "registry did not answer within 10 s:"
  tail -n 20 "$S"/log/registry.log >&2 || true
  exit 1
}

# The base image: a minimal Debian bookworm root filesystem. The tarball is kept in $S so that a
# wiped engine re-imports in seconds instead of running debootstrap again (44 s).
base_image() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then
    log "base image $BASE present"
    return 0
  fi
  local tarball=$S/debian-bookworm-minbase.tar
  if [[ ! -s $tarball ]]; then
    local root=$S/rootfs.tmp
    rm -rf "$root"
    log "debootstrap --variant=minbase bookworm from $MIRROR (about 45 s)"
    debootstrap --variant=minbase bookworm "$root" "$MIRROR" >"$S"/log/debootstrap.log 2>&1 || {
      tail -n 20 "$S"/log/debootstrap.log >&2
      exit 1
    }
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root"
  fi
  log "importing $tarball as $BASE"
  # A CMD so that tools which export images (enroot import dockerd://) accept it.
  docker import -c 'CMD ["/bin/bash"]' "$tarball" "$BASE" >/dev/null
}

stop_pid() {
  local pid=$1 i
  [[ -n $pid ]] && alive "$pid" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 200); do
    alive "$pid" || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

clean_tests() {
  local name=${1:-scdino-e2e}
  [[ $name =~ ^[a-z0-9][a-z0-9._-]*$ ]] || { log "clean-tests: bad name $name"; exit 2; }
  if engine_up; then
    docker images --format '{{.Repository}}:{{.Tag}}' |
      grep -E "(^|/)$name([:/]|\$)" | xargs -r docker rmi -f >/dev/null 2>&1 || true
    docker image prune -f >/dev/null 2>&1 || true
  fi
  if [[ -d $S/registry/docker/registry/v2/repositories/$name ]]; then
    # Stopped first: a running registry caches blob descriptors in memory and would answer
    # "exists" for a blob collected under it. `start` brings it back.
    stop_pid "$(pid_of "$S"/registry.pid)"
    rm -rf "$S/registry/docker/registry/v2/repositories/$name"
    docker-registry garbage-collect "$S"/registry.yml >/dev/null 2>&1 || true
  fi
  log "$name images removed"
}

case ${1:-} in
start)
  install_packages
  start_engine
  start_registry
  base_image
  log "up: engine $SOCK, registry 127.0.0.1:$PORT, base image $BASE"
  ;;
stop)
  stop_pid "$(pid_of "$S"/registry.pid)"
  stop_pid "$(pid_of "$S"/dockerd.pid)"
  log "stopped"
  ;;
clean-tests)
  clean_tests "${2:-}"
  ;;
status)
  engine_up || { log "engine not answering on $SOCK"; exit 1; }
  registry_up || { log "registry not answering on 127.0.0.1:$PORT"; exit 1; }
  log "engine and registry up"
  ;;
env)
  printf 'export SCDINO_TEST_REGISTRY=%q SCDINO_BASE_IMAGE=%q\n' "127.0.0.1:$PORT" "$BASE"
  ;;
*)
  echo "usage: $0 start|stop|status|env|clean-tests [NAME]" >&2
  exit 2
  ;;
esac
