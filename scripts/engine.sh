#!/usr/bin/env bash
# Bring up (or check, or stop) the Docker engine sandbox-supervisor needs.
#
#   scripts/engine.sh up       # idempotent: do nothing if the API answers
#   scripts/engine.sh status   # exit 0 when the API answers
#   scripts/engine.sh down     # stop the dockerd *this script* started, nothing else
#
# Why a shell script and not Python: it must work on a fresh machine before any
# virtualenv exists, and it needs nothing beyond coreutils, curl/python3 and apt.
set -euo pipefail

SANDVISOR_RUN_DIR=${SANDVISOR_ENGINE_RUN_DIR:-/var/run/sandvisor-engine}
PIDFILE="$SANDVISOR_RUN_DIR/dockerd.pid"
LOGFILE=${SANDVISOR_ENGINE_LOG:-/var/log/sandvisor-dockerd.log}
CONFIG=${SANDVISOR_DAEMON_CONFIG:-/etc/docker/daemon.json}
# A sidecar records the checksum of the daemon config we wrote, so we only ever
# rewrite a file that is provably ours.
CONFIG_MARK="$CONFIG.sandvisor-managed"
WAIT_S=${SANDVISOR_ENGINE_WAIT_S:-90}

say() { printf 'engine: %s\n' "$*" >&2; }

api_answers() {
  # Honour DOCKER_HOST when it points somewhere else than the local socket.
  if [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != unix://* ]]; then
    command -v docker >/dev/null 2>&1 && docker version >/dev/null 2>&1
    return
  fi
  local sock=/var/run/docker.sock
  [[ "${DOCKER_HOST:-}" == unix://* ]] && sock=${DOCKER_HOST#unix://}
  [[ -S "$sock" ]] || return 1
  if command -v curl >/dev/null 2>&1; then
    [[ "$(curl -s --max-time 5 --unix-socket "$sock" http://localhost/_ping 2>/dev/null)" == "OK" ]]
  else
    python3 - "$sock" <<'PY'
import socket, sys
s = socket.socket(socket.AF_UNIX); s.settimeout(5)
try:
    s.connect(sys.argv[1]); s.sendall(b"GET /_ping HTTP/1.0\r\nHost: x\r\n\r\n")
    sys.exit(0 if b"OK" in s.recv(4096) else 1)
except OSError:
    sys.exit(1)
PY
  fi
}

desired_config() {
  cat <<'JSON'
{
  "live-restore": true,
  "log-driver": "json-file",
  "log-opts": {"max-size": "32m", "max-file": "4"},
  "runtimes": {
    "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}
  }
}
JSON
}

manual_steps() {
  cat >&2 <<'TXT'
engine: no Docker engine answers, and this script can only install one as root on Debian.
Do one of the following, then run `make engine` (or `scripts/engine.sh up`) again:
  * point DOCKER_HOST at an engine you already run, e.g.
      export DOCKER_HOST=unix:///var/run/docker.sock
  * or, as root on Debian 12:
      apt-get update && apt-get install -y docker.io runsc
      # add to /etc/docker/daemon.json:
      #   "live-restore": true,
      #   "log-driver": "json-file", "log-opts": {"max-size": "32m", "max-file": "4"},
      #   "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}
      dockerd >/var/log/dockerd.log 2>&1 &
TXT
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  [[ -x /usr/bin/runsc ]] || missing+=(runsc)
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]} from Debian's packages (refreshing package lists first)"
  # Keep the packages' maintainer scripts from starting an engine behind our back:
  # we start dockerd ourselves, with our own pid file and log.
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" iptables ca-certificates >/dev/null; } || rc=$?
  ((own_policy)) && rm -f /usr/sbin/policy-rc.d
  if ((rc)); then say "apt-get failed (exit $rc)"; return "$rc"; fi
}

write_config() {
  mkdir -p "$(dirname "$CONFIG")"
  local want; want=$(desired_config)
  if [[ -e "$CONFIG" ]]; then
    local have_sum; have_sum=$(sha256sum "$CONFIG" | cut -d' ' -f1)
    if [[ -e "$CONFIG_MARK" && "$(cat "$CONFIG_MARK")" == "$have_sum" ]]; then
      :  # ours: safe to refresh below
    else
      # Not ours: never overwrite. Say what is missing instead.
      local missing
      missing=$(python3 - "$CONFIG" <<'PY'
import json, sys
try:
    cfg = json.load(open(sys.argv[1]))
except Exception as exc:  # noqa: BLE001 - report anything unreadable
    print(f"  (could not parse {sys.argv[1]}: {exc})"); sys.exit(0)
out = []
if cfg.get("live-restore") is not True:
    out.append('"live-restore": true')
if "runsc" not in cfg.get("runtimes", {}):
    out.append('"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}')
if cfg.get("log-driver", "json-file") != "json-file" or "max-size" not in cfg.get("log-opts", {}):
    out.append('"log-driver": "json-file", "log-opts": {"max-size": "32m", "max-file": "4"}')
print("\n".join("  " + line for line in out))
PY
)
      if [[ -n "$missing" ]]; then
        say "$CONFIG exists and was not written by sandbox-supervisor; leaving it alone."
        say "for gVisor, live-restore and log rotation, add these keys to it:"
        printf '%s\n' "$missing" >&2
      fi
      return 0
    fi
  fi
  printf '%s\n' "$want" >"$CONFIG"
  sha256sum "$CONFIG" | cut -d' ' -f1 >"$CONFIG_MARK"
  say "wrote $CONFIG"
}

our_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ -n "$pid" && -d /proc/$pid ]] || return 1
  [[ "$(tr '\0' ' ' </proc/"$pid"/cmdline)" == *dockerd* ]] || return 1
  printf '%s' "$pid"
}

cmd_up() {
  if api_answers; then
    say "Docker API answers; nothing to do"
    return 0
  fi
  if [[ -n "${DOCKER_HOST:-}" && "${DOCKER_HOST}" != unix:///var/run/docker.sock ]]; then
    say "DOCKER_HOST=$DOCKER_HOST does not answer; not starting a local engine in its place"
    return 1
  fi
  if [[ $EUID -ne 0 || ! -r /etc/debian_version ]]; then
    manual_steps
    return 1
  fi
  install_packages
  write_config
  if pid=$(our_pid); then
    say "dockerd (pid $pid, started earlier by this script) is not answering yet; waiting"
  else
    mkdir -p "$SANDVISOR_RUN_DIR" "$(dirname "$LOGFILE")"
    say "starting dockerd (log: $LOGFILE)"
    # setsid: the engine must outlive the shell (and make) that started it.
    setsid dockerd --config-file "$CONFIG" --pidfile "$PIDFILE" \
      >>"$LOGFILE" 2>&1 </dev/null &
  fi
  local waited=0
  until api_answers; do
    if ((waited >= WAIT_S)); then
      say "dockerd did not answer within ${WAIT_S}s; last lines of $LOGFILE:"
      tail -n 20 "$LOGFILE" >&2 || true
      return 1
    fi
    sleep 1
    waited=$((waited + 1))
  done
  say "Docker API answers (after ${waited}s)"
}

cmd_down() {
  local pid
  if ! pid=$(our_pid); then
    say "no dockerd started by this script is running; leaving any other engine alone"
    return 0
  fi
  say "stopping dockerd pid $pid"
  kill -TERM "$pid"
  for _ in $(seq 1 60); do
    [[ -d /proc/$pid ]] || { say "stopped"; return 0; }
    sleep 0.5
  done
  say "dockerd pid $pid did not stop within 30s"
  return 1
}

cmd_status() {
  if api_answers; then say "Docker API answers"; return 0; fi
  say "Docker API does not answer"; return 1
}

case "${1:-up}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  started-by-us) our_pid >/dev/null ;;
  -h|--help|help)
    sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) say "unknown command '$1' (allowed: up, status, down)"; exit 2 ;;
esac
