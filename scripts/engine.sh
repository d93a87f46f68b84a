#!/usr/bin/env bash
# Bring up (or check, or stop) the Docker engine sandbox-supervisor needs.
#
#   scripts/engine.sh up       # idempotent: do nothing if the API answers
#   scripts/engine.sh status   # exit 0 when the API answers
#   scripts/engine.sh down     # stop the dockerd *this script* started, nothing else
#
# `sandvisor doctor --fix-engine` restarts the dockerd this script started (found by the
# same pid file) when it does not answer or is wedged, and never any other engine.
#
# On Debian 12, `up` replaces Debian 12's docker.io 20.10 (end of life; its libnetwork
# deadlocks under concurrent container starts and removals, moby #46661/#44682) with Debian
# 13's docker.io 26.1 before it starts an engine. Only docker.io and docker-cli come from
# Debian 13; their dependencies (containerd, runc, libc) stay Debian 12's, and the system's
# apt sources are not changed. It never touches an engine that is running.
# SANDVISOR_KEEP_ENGINE=1 keeps the installed engine as it is.
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

with_policy_rc() {
  # Run "$@" with the packages' maintainer scripts kept from starting an engine behind our
  # back: we start dockerd ourselves, with our own pid file and log.
  local own_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    own_policy=1
  fi
  local rc=0
  "$@" || rc=$?
  ((own_policy)) && rm -f /usr/sbin/policy-rc.d
  return "$rc"
}

install_packages() {
  local missing=()
  command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
  [[ -x /usr/bin/runsc ]] || missing+=(runsc)
  ((${#missing[@]})) || return 0
  say "installing ${missing[*]} from Debian's packages (refreshing package lists first)"
  local rc=0
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" iptables ca-certificates >/dev/null; } || rc=$?
  if ((rc)); then say "apt-get failed (exit $rc)"; return "$rc"; fi
}

engine_version() {
  # The version of the installed dockerd binary, e.g. 20.10.24+dfsg1 (empty when none).
  command -v dockerd >/dev/null 2>&1 || return 0
  dockerd --version 2>/dev/null | sed -n 's/^Docker version \([^,]*\),.*/\1/p'
}

install_debs() {
  # The system's own lists resolve the dependencies; refresh them once if they are stale.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
}

upgrade_bookworm_engine() {
  # Debian 12 ships docker.io 20.10, which deadlocks (see the top of this file). Install
  # Debian 13's docker.io and docker-cli from a private package list: nothing is added to
  # /etc/apt, and apt resolves every other dependency from the system's own release.
  [[ "${SANDVISOR_KEEP_ENGINE:-0}" == 1 ]] && return 0
  [[ "$(cut -d. -f1 /etc/debian_version 2>/dev/null)" == 12 ]] || return 0
  local have; have=$(engine_version)
  [[ "$have" == 20.10.* ]] || return 0
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [[ -r "$keyring" ]] || { say "no $keyring: keeping Docker $have"; return 0; }
  say "Docker $have is Debian 12's engine (end of life, known deadlocks): installing Debian 13's docker.io"
  local dir; dir=$(mktemp -d /tmp/sandvisor-engine-apt.XXXXXX)
  mkdir -p "$dir/lists/partial" "$dir/debs"
  printf 'deb [signed-by=%s] http://deb.debian.org/debian trixie main\n' "$keyring" >"$dir/sources.list"
  local apt_opts=(-o "Dir::Etc::sourcelist=$dir/sources.list" -o "Dir::Etc::sourceparts=/nonexistent"
    -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache::archives=$dir/debs" -o "APT::Get::List-Cleanup=0"
    -o "APT::Sandbox::User=root")
  local rc=0
  {
    apt-get "${apt_opts[@]}" update -qq &&
      (cd "$dir/debs" && apt-get "${apt_opts[@]}" download docker.io docker-cli >/dev/null) &&
      install_debs "$dir"/debs/docker.io_*.deb "$dir"/debs/docker-cli_*.deb
  } || rc=$?
  rm -rf "$dir"
  if ((rc)); then
    say "could not install Debian 13's docker.io (exit $rc): keeping Docker $have"
    return 0
  fi
  say "installed Docker $(engine_version)"
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
  # The dockerd this script started: the pid file names a live process whose program (the
  # first field of its command line) is dockerd. A match anywhere in the command line is not
  # enough: `tail -f /var/log/sandvisor-dockerd.log` would pass. `sandvisor doctor
  # --fix-engine` decides the same way (supervisor/tooling/engine_owner.py).
  [[ -f "$PIDFILE" ]] || return 1
  local pid; pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
  local program=""
  IFS= read -r -d '' program <"/proc/$pid/cmdline" 2>/dev/null || true
  [[ "${program##*/}" == dockerd ]] || return 1
  printf '%s' "$pid"
}

cmd_up() {
  if api_answers; then
    say "Docker API answers; nothing to do: $(answering_version)"
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
  with_policy_rc install_packages
  with_policy_rc upgrade_bookworm_engine
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
  say "Docker API answers (after ${waited}s): $(answering_version)"
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

answering_version() {
  # What the engine that answers says it is (the API's own /version).
  local sock=/var/run/docker.sock
  [[ "${DOCKER_HOST:-}" == unix://* ]] && sock=${DOCKER_HOST#unix://}
  local v
  v=$(curl -s --max-time 5 --unix-socket "$sock" http://localhost/version 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("Version", "?"))' 2>/dev/null) || v="?"
  if [[ "$v" == 20.10.* ]]; then
    printf 'Docker %s (20.10 is end of life and has known libnetwork deadlocks; see the README)' "$v"
  else
    printf 'Docker %s' "$v"
  fi
}

cmd_status() {
  if api_answers; then say "Docker API answers: $(answering_version)"; return 0; fi
  say "Docker API does not answer"; return 1
}

case "${1:-up}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  started-by-us) our_pid >/dev/null ;;
  -h|--help|help)
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' ;;
  *) say "unknown command '$1' (allowed: up, status, down)"; exit 2 ;;
esac
