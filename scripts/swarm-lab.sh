#!/usr/bin/env bash
# A real 3-node Docker Swarm on this one machine, for the Swarm backend and its tests.
#
#   scripts/swarm-lab.sh up            # build or repair the lab; last line: DOCKER_HOST=unix://…
#   scripts/swarm-lab.sh status        # the nodes; exit 0 only when all three are Ready
#   scripts/swarm-lab.sh down          # stop what the lab started, remove its netns and files
#   scripts/swarm-lab.sh env           # the lab's endpoints as shell assignments
#   scripts/swarm-lab.sh cut|heal NODE         # unplug / replug a node's veth (node loss)
#   scripts/swarm-lab.sh drain|activate NODE   # Swarm availability of a node
#
# NODE is manager, w1 or w2. Each node is a private dockerd with its own containerd, config,
# data root and exec root, in a network namespace of its own (own IP, iptables, bridge, swarm
# ports), joined to the others by veths on a bridge in a hub namespace. w2 runs every task
# under gVisor (runsc is its default runtime) and carries the label sandbox=gvisor. Every
# node advertises its own engine in the node label io.sandvisor.engine. The recipe and its
# pitfalls: ../shared/research/scaleout.md section 2.
#
# `up` is idempotent and converges: links up, availability active, images current, one
# cluster of exactly these three nodes. It never touches the host's engine (images are only
# read from it) and `down` signals only processes the lab started: by its pid files, plus
# containerd shims and runsc processes that name the lab's folders or live in its netns, and
# container processes whose cgroup is one of the lab's containers (after a hard crash).
#
# Settings (environment): SANDVISOR_LAB_STATE_DIR (/var/lib/sandvisor-swarm-lab: data roots, logs),
# SANDVISOR_LAB_RUN_DIR (/run/sandvisor-swarm-lab: sockets nN.sock, pid files, configs, exec roots),
# SANDVISOR_LAB_NS_PREFIX (svsw), SANDVISOR_LAB_NET (10.77.0), SANDVISOR_LAB_IMAGES, SANDVISOR_LAB_OPTIONAL_IMAGES
# (sandvisor/dev:latest when the host has it; empty to skip its minute of loading),
# SANDVISOR_LAB_HEARTBEAT (5s), SANDVISOR_LAB_IPTABLES (true), SANDVISOR_LAB_SOURCE_HOST, SANDVISOR_LAB_WAIT_S.
#
# shellcheck disable=SC2016  # '$0', '$@' and Go templates are meant for sh -c and docker
# shellcheck disable=SC2013  # word-splitting path lists is fine: the lab's paths have no spaces
# shellcheck disable=SC2030,SC2031  # pipeline subshells only read what they set
set -euo pipefail
unset DOCKER_HOST DOCKER_CONTEXT # every docker call below names its engine explicitly

STATE_DIR=${SANDVISOR_LAB_STATE_DIR:-/var/lib/sandvisor-swarm-lab} # data roots, logs
RUN_DIR=${SANDVISOR_LAB_RUN_DIR:-/run/sandvisor-swarm-lab}         # sockets, pid files, configs, exec roots
NS=${SANDVISOR_LAB_NS_PREFIX:-svsw}                         # netns: svsw1..3 and svswhub
NET=${SANDVISOR_LAB_NET:-10.77.0}                            # the /24 between the nodes (.11 .12 .13)
SOURCE_HOST=${SANDVISOR_LAB_SOURCE_HOST:-unix:///var/run/docker.sock} # where images come from
IMAGES=${SANDVISOR_LAB_IMAGES:-sandvisor/minimal:latest sandvisor/debian:latest}  # required on every node
OPTIONAL_IMAGES=${SANDVISOR_LAB_OPTIONAL_IMAGES-sandvisor/dev:latest}       # copied when the host has them
IPTABLES=${SANDVISOR_LAB_IPTABLES:-true} # each node has its own netns, hence its own iptables
HEARTBEAT=${SANDVISOR_LAB_HEARTBEAT:-5s} # Swarm dispatcher heartbeat: how soon a lost node is Down
WAIT_S=${SANDVISOR_LAB_WAIT_S:-120}

HUB="${NS}hub"
BRIDGE="${NS}br"
NAMES=(manager w1 w2)   # node i (1..3) is NAMES[i-1]
GVISOR_NODE=3           # w2
LOCK="${RUN_DIR%/}.lock" # outside RUN_DIR: `down` deletes RUN_DIR while holding the lock

say() { printf 'swarm-lab: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# -- naming ---------------------------------------------------------------------------------

node_index() {
  case "$1" in
    manager | n1 | 1) echo 1 ;;
    w1 | n2 | 2) echo 2 ;;
    w2 | n3 | 3) echo 3 ;;
    *) die "unknown node '$1' (allowed: manager, w1, w2)" ;;
  esac
}
name_of() { echo "${NAMES[$1 - 1]}"; }
hostname_of() { echo "sandvisor-lab-$(name_of "$1")"; }
ip_of() { echo "$NET.1$1"; }
ns_of() { echo "$NS$1"; }
veth_of() { echo "$NS${1}h"; } # the hub's end; the node's end is eth0 in its own netns
sock_of() { echo "$RUN_DIR/n$1.sock"; }
host_of() { echo "unix://$(sock_of "$1")"; }
ndir() { echo "$RUN_DIR/n$1"; }
sdir() { echo "$STATE_DIR/n$1"; }
dk() { local i=$1; shift; docker -H "$(host_of "$i")" "$@"; }

# -- processes ------------------------------------------------------------------------------

# The pid in $1 if that process is alive and its command line contains $2 (a path unique to
# this lab), so a recycled pid is never mistaken for ours.
live_pid() {
  local pid
  [[ -f "$1" ]] || return 1
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
  [[ "$(tr '\0' ' ' </proc/"$pid"/cmdline)" == *"$2"* ]] || return 1
  [[ "$(awk '{print $3}' /proc/"$pid"/stat 2>/dev/null)" != Z ]] || return 1
  printf '%s' "$pid"
}
dockerd_pid() { live_pid "$(ndir "$1")/dockerd.pid" "$(ndir "$1")/daemon.json"; }
containerd_pid() { live_pid "$(ndir "$1")/containerd.pid" "$(ndir "$1")/containerd.toml"; }

answers() { # the node's engine API answers (the docker CLI: curl may not be installed)
  [[ -S "$(sock_of "$1")" ]] && dk "$1" version -f '{{.Server.Version}}' >/dev/null 2>&1
}

wait_for() { # wait_for SECONDS WHAT COMMAND...: poll a condition, fail with WHAT
  local limit=$1 what=$2 start=$SECONDS
  shift 2
  until "$@"; do
    ((SECONDS - start < limit)) || { say "timed out after ${limit}s waiting for $what"; return 1; }
    sleep 0.2
  done
}

gone() { [[ ! -d /proc/$1 ]] || [[ "$(awk '{print $3}' /proc/"$1"/stat 2>/dev/null)" == Z ]]; }

stop_pid() { # stop_pid PID WHAT SECONDS: SIGTERM, then SIGKILL after SECONDS
  local pid=$1 what=$2 limit=$3
  gone "$pid" && return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  if ! wait_for "$limit" "$what (pid $pid) to exit" gone "$pid" 2>/dev/null; then
    say "$what (pid $pid) ignored SIGTERM for ${limit}s; SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_for 10 "$what (pid $pid) to die" gone "$pid" || true
  fi
}

# Processes left by node i after its dockerd and containerd are gone: containerd shims and
# runsc sandboxes/gofers. Ours because they name this node's folders on their command line,
# or because they run in this node's network namespace (which only the lab uses).
leftover_pids() {
  local i=$1 f pid exe
  {
    ip netns pids "$(ns_of "$i")" 2>/dev/null || true
    for f in $(grep -lasF -e "$(ndir "$i")/" -e "$(sdir "$i")/" -e "$(ndir "$i").sock" \
        /proc/[0-9]*/cmdline 2>/dev/null); do
      pid=${f#/proc/} pid=${pid%/cmdline}
      exe=$(tr '\0' '\n' 2>/dev/null <"$f" | head -n1) || continue
      exe=${exe##*/}
      if [[ "$exe" == containerd* || "$exe" == runsc* ]]; then echo "$pid"; fi
    done
  } | sort -un | grep -vx "$$" || true
}

# Processes of node i's containers that outlived their engine (dockerd and containerd killed
# hard leave runc containers running): those whose cgroup names one of the node's container
# ids, as listed in its data root.
container_pids() {
  local d ids="" f pid
  for d in "$(sdir "$1")"/docker/containers/*; do
    [[ "${d##*/}" =~ ^[0-9a-f]{64}$ ]] && ids+="${d##*/}"$'\n'
  done
  [[ -n "$ids" ]] || return 0
  ids=${ids%$'\n'}
  for f in $(grep -lsF "$ids" /proc/[0-9]*/cgroup 2>/dev/null); do
    pid=${f#/proc/} pid=${pid%/cgroup}
    echo "$pid"
  done | grep -vx "$$" || true
}

# -- prerequisites --------------------------------------------------------------------------

preflight() {
  [[ $EUID -eq 0 ]] || die "needs root (network namespaces, dockerd)"
  if ! command -v ip >/dev/null 2>&1 && [[ -r /etc/debian_version ]]; then
    # Not pulled in by docker.io without its recommends (scripts/engine.sh installs none).
    say "installing iproute2 from Debian's packages"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends iproute2 >/dev/null
  fi
  local tool missing=()
  for tool in ip nsenter unshare setsid flock dockerd containerd docker runsc; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
  done
  ((${#missing[@]} == 0)) || die "missing ${missing[*]}; run \`make engine\` first (installs docker.io and runsc)"
  docker -H "$SOURCE_HOST" version >/dev/null 2>&1 ||
    die "the host engine ($SOURCE_HOST) does not answer; run \`make engine\`"
}

# -- network --------------------------------------------------------------------------------

ns_exists() { [[ -e "/run/netns/$1" ]]; }

own_ns() { # create a netns recorded as the lab's, or adopt one the lab recorded earlier
  local ns=$1
  if ns_exists "$ns"; then
    grep -qx "$ns" "$RUN_DIR/netns" 2>/dev/null ||
      die "network namespace $ns exists but this lab did not create it; set SANDVISOR_LAB_NS_PREFIX"
    return 0
  fi
  echo "$ns" >>"$RUN_DIR/netns" # recorded first: an interrupted `up` still leaves it to `down`
  ip netns add "$ns"
  ip -n "$ns" link set lo up
}

ensure_network() {
  own_ns "$HUB"
  ip -n "$HUB" link show "$BRIDGE" >/dev/null 2>&1 || ip -n "$HUB" link add "$BRIDGE" type bridge
  ip -n "$HUB" link set "$BRIDGE" up
  local i ns veth
  for i in 1 2 3; do
    ns=$(ns_of "$i") veth=$(veth_of "$i")
    own_ns "$ns"
    if ! ip -n "$HUB" link show "$veth" >/dev/null 2>&1; then
      ip -n "$ns" link del eth0 2>/dev/null || true # half of a pair from an interrupted `up`
      ip -n "$HUB" link add "$veth" type veth peer name eth0 netns "$ns"
    fi
    ip -n "$HUB" link set "$veth" master "$BRIDGE"
    ip -n "$HUB" link set "$veth" up # `up` also heals a node that was cut
    ip -n "$ns" -4 addr show dev eth0 | grep -q "inet $(ip_of "$i")/24" ||
      ip -n "$ns" addr add "$(ip_of "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

# -- daemons --------------------------------------------------------------------------------

# Written only when different, so an unchanged lab is left alone; returns 0 when it changed.
write_if_changed() {
  local path=$1 content=$2
  [[ -f "$path" && "$(cat "$path")" == "$content" ]] && return 1
  printf '%s\n' "$content" >"$path"
}

containerd_config() {
  local i=$1
  # dockerd 20.10 would silently share /run/containerd/containerd.sock when it exists, and
  # with it the host's containerd (and its netns). Each node gets its own, started by us.
  cat <<TOML
version = 2
root = "$(sdir "$i")/containerd"
state = "$(ndir "$i")/containerd"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
oom_score = 0
[grpc]
  address = "$(ndir "$i")/containerd.sock"
[ttrpc]
  address = "$(ndir "$i")/containerd.sock.ttrpc"
[debug]
  address = "$(ndir "$i")/containerd-debug.sock"
  level = "warn"
TOML
}

daemon_config() {
  local i=$1 runtimes=""
  if ((i == GVISOR_NODE)); then
    # Swarm cannot choose a runtime per service: a gVisor node runs *everything* under runsc.
    # --network=none: networked gVisor fails in this nested VM (DESIGN.md).
    runtimes='
  "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}},
  "default-runtime": "runsc",'
  fi
  # Never the host's daemon.json: its live-restore makes swarm mode refuse to start.
  # no-new-privileges: Swarm's ContainerSpec (API 1.41) cannot ask for it per service, so
  # the engine sets it for every container (docs/swarm.md, "What Swarm cannot express").
  cat <<JSON
{${runtimes}
  "live-restore": false,
  "no-new-privileges": true,
  "iptables": ${IPTABLES},
  "bip": "172.30.$i.1/24",
  "log-driver": "json-file",
  "log-opts": {"max-size": "32m", "max-file": "4"},
  "log-level": "warn"
}
JSON
}

start_containerd() {
  local i=$1 d; d=$(ndir "$i")
  rm -f "$d/containerd.sock" "$d/containerd.sock.ttrpc" "$d/containerd-debug.sock"
  # In the node's netns (host-network containers take containerd's), detached from us.
  # The wrapper records its own pid, which exec hands on to containerd.
  setsid sh -c 'echo $$ >"$0"; exec "$@"' "$d/containerd.pid" \
    nsenter --net="/run/netns/$(ns_of "$i")" -- \
    containerd --config "$d/containerd.toml" \
    >>"$(sdir "$i")/containerd.log" 2>&1 </dev/null 9>&- &
}

start_dockerd() {
  local i=$1 d; d=$(ndir "$i")
  rm -f "$d/dockerd.pid" # not live (checked by the caller); dockerd refuses a stale one
  # nsenter --net, not `ip netns exec`: the latter adds a mount namespace with / as a slave,
  # hiding mounts from processes outside it. unshare --uts: a hostname per node, which
  # Swarm reports as the node's name.
  setsid nsenter --net="/run/netns/$(ns_of "$i")" -- \
    unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "$(hostname_of "$i")" \
    dockerd --config-file "$d/daemon.json" \
    --data-root "$(sdir "$i")/docker" --exec-root "$d/exec" --pidfile "$d/dockerd.pid" \
    -H "$(host_of "$i")" --containerd "$d/containerd.sock" \
    --containerd-namespace "sandvisor-lab-n$i" --containerd-plugins-namespace "sandvisor-lab-n$i-plugins" \
    >>"$(sdir "$i")/dockerd.log" 2>&1 </dev/null 9>&- &
}

ensure_daemons() {
  local i d restart pid
  for i in 1 2 3; do
    d=$(ndir "$i")
    mkdir -p "$d" "$(sdir "$i")"
    restart=0
    write_if_changed "$d/containerd.toml" "$(containerd_config "$i")" && restart=1
    write_if_changed "$d/daemon.json" "$(daemon_config "$i")" && restart=1
    if ((restart)); then # a new config (the script changed): apply it
      [[ -n "$(dockerd_pid "$i" || true)" ]] && stop_pid "$(dockerd_pid "$i")" "dockerd n$i" 40
      [[ -n "$(containerd_pid "$i" || true)" ]] && stop_pid "$(containerd_pid "$i")" "containerd n$i" 20
    fi
    if ! containerd_pid "$i" >/dev/null; then
      # A dockerd bound to a dead containerd cannot recover: restart both.
      if pid=$(dockerd_pid "$i"); then stop_pid "$pid" "dockerd n$i" 40; fi
      say "starting containerd for $(name_of "$i")"
      start_containerd "$i"
    fi
  done
  for i in 1 2 3; do
    wait_for 30 "containerd of $(name_of "$i")" test -S "$(ndir "$i")/containerd.sock" ||
      { tail -n 20 "$(sdir "$i")/containerd.log" >&2; return 1; }
    if ! dockerd_pid "$i" >/dev/null; then
      say "starting dockerd for $(name_of "$i") ($(host_of "$i"))"
      start_dockerd "$i"
    fi
  done
  for i in 1 2 3; do
    wait_for "$WAIT_S" "the engine of $(name_of "$i")" answers "$i" ||
      { tail -n 20 "$(sdir "$i")/dockerd.log" >&2; return 1; }
  done
}

# -- images ---------------------------------------------------------------------------------

image_id() { docker -H "$1" image inspect -f '{{.Id}}' "$2" 2>/dev/null || true; }

ensure_images() {
  local img wanted=() i
  rm -rf "$RUN_DIR"/load.* # fifos of an interrupted copy (we hold the lock: none is in use)
  for img in $IMAGES; do
    [[ -n "$(image_id "$SOURCE_HOST" "$img")" ]] ||
      die "image $img is missing on the host engine; run \`make images\`"
    wanted+=("$img")
  done
  for img in $OPTIONAL_IMAGES; do
    [[ -n "$(image_id "$SOURCE_HOST" "$img")" ]] && wanted+=("$img")
  done
  # Nodes grouped by the images they lack, so that one `docker save` feeds each group.
  declare -A group=()
  local need key
  for i in 1 2 3; do
    need=""
    for img in "${wanted[@]}"; do
      [[ "$(image_id "$(host_of "$i")" "$img")" == "$(image_id "$SOURCE_HOST" "$img")" ]] ||
        need+="$img "
    done
    [[ -n "$need" ]] && group[$need]+="$i "
  done
  for key in "${!group[@]}"; do
    say "loading ${key% } into node(s) ${group[$key]% }"
    # shellcheck disable=SC2086 # word splitting of the image and node lists is intended
    copy_images "${group[$key]}" $key
    # The images these tags named before (a rebuild on the host) would pile up otherwise.
    for i in ${group[$key]}; do dk "$i" image prune -f >/dev/null; done
  done
}

BG_PIDS=() # the image copy's processes, stopped when `up` is interrupted

copy_images() { # copy_images "NODES" IMAGE...: one save, teed into a `docker load` per node
  local nodes=$1 i fifo rc=0 tmp outs=()
  shift
  tmp=$(mktemp -d "$RUN_DIR/load.XXXXXX")
  BG_PIDS=()
  for i in $nodes; do
    fifo="$tmp/n$i"
    mkfifo "$fifo"
    dk "$i" load -q <"$fifo" >"$tmp/n$i.out" 2>&1 &
    BG_PIDS+=("$!") outs+=("$tmp/n$i.out")
  done
  # In the background and waited for: bash runs a trap only between foreground commands,
  # so a foreground pipeline would keep an interrupted `up` (and its lock) for minutes.
  mkfifo "$tmp/save"
  docker -H "$SOURCE_HOST" save "$@" >"$tmp/save" &
  local save_pid=$!
  # shellcheck disable=SC2046 # one fifo per node
  tee $(for i in $nodes; do echo "$tmp/n$i"; done) <"$tmp/save" >/dev/null &
  local tee_pid=$!
  BG_PIDS+=("$save_pid" "$tee_pid")
  wait "$save_pid" || rc=$?
  wait "$tee_pid" || rc=$?
  for i in "${!outs[@]}"; do
    wait "${BG_PIDS[$i]}" || { rc=1; cat "${outs[$i]}" >&2; }
  done
  BG_PIDS=()
  rm -rf "$tmp"
  ((rc == 0)) || die "copying images failed"
}

abort() {
  # The next `up` resumes from whatever is in place: images are compared by id, and a
  # half-loaded one has no tag yet.
  ((${#BG_PIDS[@]} == 0)) || kill -TERM "${BG_PIDS[@]}" 2>/dev/null || true
  rm -rf "$RUN_DIR"/load.*
  say "interrupted"
  exit 130
}

# -- swarm ----------------------------------------------------------------------------------

swarm_state() { dk "$1" info -f '{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}} {{.Swarm.NodeID}}' 2>/dev/null; }
node_id() { dk "$1" info -f '{{.Swarm.NodeID}}' 2>/dev/null; }
settled() { [[ "$(swarm_state "$1" | cut -d' ' -f1)" != pending ]]; }

ensure_manager() {
  # Right after a restart a node may be `pending` for a moment: let it settle first.
  wait_for 30 "the manager's swarm state to settle" settled 1 || true
  local state; state=$(swarm_state 1)
  case "$state" in
    "active true "*) return 0 ;;
    inactive*) ;;
    *) say "manager is in swarm state '$state'; leaving and starting afresh"
       dk 1 swarm leave --force >/dev/null ;;
  esac
  say "swarm init on $(ip_of 1)"
  dk 1 swarm init --advertise-addr "$(ip_of 1)" --listen-addr "$(ip_of 1):2377" \
    --dispatcher-heartbeat "$HEARTBEAT" >/dev/null
}

known_to_manager() { [[ -n "$1" ]] && dk 1 node inspect "$1" >/dev/null 2>&1; }

ensure_worker() {
  local i=$1 token=$2 state id
  wait_for 30 "$(name_of "$i")'s swarm state to settle" settled "$i" || true
  state=$(swarm_state "$i") id=$(node_id "$i")
  if [[ "$state" == "active "* ]] && known_to_manager "$id"; then return 0; fi
  [[ "$state" == inactive* ]] || { say "$(name_of "$i") is in swarm state '$state'; leaving"; dk "$i" swarm leave --force >/dev/null; }
  say "$(name_of "$i") joins the swarm"
  dk "$i" swarm join --token "$token" --advertise-addr "$(ip_of "$i")" \
    --listen-addr "$(ip_of "$i"):2377" "$(ip_of 1):2377" >/dev/null
}

label_of() { dk 1 node inspect -f "{{index .Spec.Labels \"$2\"}}" "$1" 2>/dev/null; }

ensure_node_spec() { # labels and availability, touched only when they differ
  local i=$1 id=$2 args=()
  [[ "$(label_of "$id" io.sandvisor.engine)" == "$(host_of "$i")" ]] || args+=(--label-add "io.sandvisor.engine=$(host_of "$i")")
  [[ "$(label_of "$id" io.sandvisor.lab.node)" == "$(name_of "$i")" ]] || args+=(--label-add "io.sandvisor.lab.node=$(name_of "$i")")
  if ((i == GVISOR_NODE)); then
    [[ "$(label_of "$id" sandbox)" == gvisor ]] || args+=(--label-add sandbox=gvisor)
  fi
  [[ "$(dk 1 node inspect -f '{{.Spec.Availability}}' "$id")" == active ]] || args+=(--availability active)
  ((${#args[@]} == 0)) || dk 1 node update "${args[@]}" "$id" >/dev/null
}

all_ready() {
  local id
  for id in "$@"; do
    [[ "$(dk 1 node inspect -f '{{.Status.State}}' "$id" 2>/dev/null)" == ready ]] || return 1
  done
}

ensure_swarm() {
  ensure_manager
  local token i ids=() id
  token=$(dk 1 swarm join-token -q worker)
  for i in 2 3; do ensure_worker "$i" "$token"; done
  for i in 1 2 3; do
    id=$(node_id "$i")
    wait_for 30 "$(name_of "$i") to be known to the manager" known_to_manager "$id"
    ids+=("$id")
    ensure_node_spec "$i" "$id"
  done
  # Nodes of earlier joins (a worker that re-joined gets a new ID) are not part of the lab.
  for id in $(dk 1 node ls -q); do
    [[ " ${ids[*]} " == *" $id "* ]] || { say "removing stale node $id"; dk 1 node rm --force "$id" >/dev/null; }
  done
  wait_for "$WAIT_S" "all three nodes to be Ready" all_ready "${ids[@]}"
}

# -- commands -------------------------------------------------------------------------------

# fd 9 holds the lock; the daemons are started with `9>&-` so they never inherit it.
lock() { mkdir -p "$(dirname "$LOCK")"; exec 9>"$LOCK"; flock 9; }

cmd_up() {
  preflight
  lock
  trap abort INT TERM
  local t0=$SECONDS phase step times=""
  mkdir -p "$RUN_DIR" "$STATE_DIR"
  for phase in network daemons images swarm; do
    step=$SECONDS
    "ensure_$phase"
    times+="${times:+, }$phase $((SECONDS - step))s"
  done
  say "lab ready in $((SECONDS - t0))s ($times): manager $(host_of 1), workers $(host_of 2) $(host_of 3) (gVisor: $(name_of "$GVISOR_NODE"))"
  echo "DOCKER_HOST=$(host_of 1)"
}

cmd_down() {
  [[ $EUID -eq 0 ]] || die "needs root"
  lock
  local i pid pids=()
  for i in 1 2 3; do
    # Containers first, quickly: dockerd would otherwise give each its stop timeout.
    if answers "$i"; then
      dk "$i" ps -aq 2>/dev/null | xargs -r docker -H "$(host_of "$i")" rm -f >/dev/null 2>&1 || true
    fi
  done
  for i in 1 2 3; do
    if pid=$(dockerd_pid "$i"); then kill -TERM "$pid" 2>/dev/null || true; pids+=("$pid"); fi
  done
  for pid in "${pids[@]}"; do stop_pid "$pid" dockerd 40; done
  for i in 1 2 3; do
    if pid=$(containerd_pid "$i"); then stop_pid "$pid" "containerd n$i" 20; fi
    for pid in $(leftover_pids "$i"); do
      say "stopping leftover $(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline | cut -c1-80) (pid $pid)"
      stop_pid "$pid" "leftover of n$i" 10
    done
    for pid in $(container_pids "$i"); do
      say "killing leftover container process $(tr '\0' ' ' 2>/dev/null </proc/"$pid"/cmdline | cut -c1-60) (pid $pid)"
      kill -KILL "$pid" 2>/dev/null || true
    done
  done
  # Mounts dockerd left under our folders (overlay layers, netns files): deepest first.
  local target
  for i in 1 2 3; do
    for target in $(awk -v a="$(sdir "$i")/" -v b="$(ndir "$i")/" \
        'index($2, a) == 1 || index($2, b) == 1 {print $2}' /proc/mounts | sort -r); do
      umount -l "$target" 2>/dev/null || true
    done
  done
  if [[ -f "$RUN_DIR/netns" ]]; then
    local ns
    for ns in $(tac "$RUN_DIR/netns"); do
      if ns_exists "$ns"; then ip netns del "$ns" || say "could not delete netns $ns"; fi
    done
  fi
  # Only what the lab made, then the folders if that left them empty: SANDVISOR_LAB_*_DIR may
  # name a folder that holds other things.
  for i in 1 2 3; do rm -rf "$(ndir "$i")" "$(sock_of "$i")" "$(sdir "$i")"; done
  rm -rf "$RUN_DIR/netns" "$RUN_DIR"/load.*
  rmdir "$RUN_DIR" "$STATE_DIR" 2>/dev/null || true
  say "lab removed"
}

cmd_status() {
  local i rc=0
  for i in 1 2 3; do
    if answers "$i"; then
      say "$(name_of "$i"): engine $(host_of "$i") answers (netns $(ns_of "$i"), $(ip_of "$i"))"
    else
      say "$(name_of "$i"): engine $(host_of "$i") does not answer"; rc=1
    fi
  done
  answers 1 || return 1
  local ids; ids=$(dk 1 node ls -q 2>/dev/null) || { say "the manager is not in a swarm"; return 1; }
  [[ -n "$ids" ]] || return 1
  # shellcheck disable=SC2086
  dk 1 node inspect $ids -f '{{.ID}} {{.Description.Hostname}} {{.Spec.Role}} {{.Spec.Availability}} {{.Status.State}} {{.Status.Addr}} {{range $k, $v := .Spec.Labels}}{{$k}}={{$v}},{{end}}' |
    awk 'BEGIN {printf "%-26s %-16s %-8s %-12s %-8s %-11s %s\n", "ID", "HOSTNAME", "ROLE", "AVAILABILITY", "STATE", "ADDR", "LABELS"}
         {sub(/,$/, "", $7); printf "%-26s %-16s %-8s %-12s %-8s %-11s %s\n", $1, $2, $3, $4, $5, $6, $7}'
  local ready
  # shellcheck disable=SC2086
  ready=$(dk 1 node inspect $ids -f '{{.Status.State}} {{index .Spec.Labels "io.sandvisor.lab.node"}}' | awk '$1 == "ready" && $2 != ""' | wc -l)
  if ((ready != 3)); then say "$ready of 3 lab nodes are Ready"; rc=1; fi
  return "$rc"
}

cmd_env() {
  echo "DOCKER_HOST=$(host_of 1)"
  local i
  for i in 1 2 3; do
    local n; n=$(name_of "$i" | tr '[:lower:]' '[:upper:]')
    echo "SANDVISOR_LAB_${n}_HOST=$(host_of "$i")"
    echo "SANDVISOR_LAB_${n}_NETNS=$(ns_of "$i")"
    echo "SANDVISOR_LAB_${n}_IP=$(ip_of "$i")"
  done
  echo "SANDVISOR_LAB_GVISOR_NODE=$(name_of "$GVISOR_NODE")"
}

cmd_link() { # cut|heal NODE: the hub's end of the node's veth, like pulling its cable
  local i; i=$(node_index "$2")
  ns_exists "$HUB" || die "the lab is not up"
  ip -n "$HUB" link set "$(veth_of "$i")" "$1"
  say "$(name_of "$i"): link $1"
}

cmd_availability() { # drain|active NODE
  local i id; i=$(node_index "$2")
  id=$(node_id "$i") # from the node's own engine; by label when it does not answer
  [[ -n "$id" ]] || id=$(dk 1 node ls -q --filter "node.label=io.sandvisor.lab.node=$(name_of "$i")")
  [[ -n "$id" ]] || die "cannot find the node id of $(name_of "$i")"
  dk 1 node update --availability "$1" "$id" >/dev/null
  say "$(name_of "$i") ($id): availability $1"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  env) cmd_env ;;
  cut) [[ -n "${2:-}" ]] || die "usage: $0 cut NODE"; cmd_link down "$2" ;;
  heal) [[ -n "${2:-}" ]] || die "usage: $0 heal NODE"; cmd_link up "$2" ;;
  drain) [[ -n "${2:-}" ]] || die "usage: $0 drain NODE"; cmd_availability drain "$2" ;;
  activate) [[ -n "${2:-}" ]] || die "usage: $0 activate NODE"; cmd_availability active "$2" ;;
  -h | --help | help) awk 'NR > 1 && /^# shellcheck/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0" ;;
  *) say "unknown command '${1:-}' (allowed: up, status, down, env, cut, heal, drain, activate)"; exit 2 ;;
esac
