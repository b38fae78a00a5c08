#!/usr/bin/env bash
# An emulated cluster on this machine: N "nodes", each a network namespace
# with one interface (zc0) on a star of veth pairs joined by a bridge in a
# hub namespace, each link limited in rate (tc tbf, both directions) and,
# where the kernel has netem, in latency. `zero-run --nnodes N --node-rank i`
# runs in node i; everything is removed when the script ends, on success,
# failure, Ctrl-C or SIGTERM (trap), and a cluster whose script was killed
# with SIGKILL is removed by the next run (its namespaces carry the PID, or
# with --name, an owner file does).
#
#   bash tools/netns-cluster.sh [options] [--] PROGRAM [ARGS...]
#
#   --nodes N          nodes (default 2)
#   --nproc P          ranks on each node (default 2)
#   --rate R           each node's link rate each way, tc's units (default 1gbit)
#   --delay D          added one-way delay on each node's link (tc netem, e.g.
#                      1ms); an error where the kernel has no netem
#   --zero-run PATH    the launcher (default: build/tools/launcher/zero-run)
#   --name NAME        namespaces NAME-hub and NAME-n<i> (default zc<pid>),
#                      so that a caller can act on a link mid-run:
#                      ip -n NAME-n1 link set zc0 down
#                      (left by a run killed with SIGKILL, a named cluster is
#                      swept by the next run of that name, as zc<pid> ones
#                      are by any later run; one whose run is alive is refused)
#   --time-limit S     stop every node after S seconds (default: none)
#   --launcher-arg A   one more argument for every zero-run (repeatable)
#
# Node i has address 10.77.0.<i+1>; node 0 runs rank 0 and the store
# (MASTER_ADDR 10.77.0.1, MASTER_PORT 29500: the namespaces are this
# cluster's own, so no port is shared with anything else). The ranks get
# GLOO_SOCKET_IFNAME=zc0, so gloo binds the link's address. Nothing is made
# outside the namespaces: the veth pairs are created inside them.
#
# Each node's zero-run runs to its own end: a failure on one node does not
# stop the others (as on separate machines, their ranks find out through
# their collectives). For each node the script prints
#   netns-cluster: node I exited with status S after T ms
# and at the end each link's bytes as the hub counted them:
#   netns-cluster: node I link: sent B bytes, received B bytes
# Exit status: 0 when every node exited 0; else the status of the first
# node (in node order) that did not; 77 when namespaces cannot be made
# here (not root, no iproute2, no veth or bridge), saying why.
set -euo pipefail

nodes=2 nproc=2 rate=1gbit delay="" name="" time_limit=0
zero_run="$(cd "$(dirname "$0")/.." && pwd)/build/tools/launcher/zero-run"
launcher_args=()
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes) nodes="$2"; shift 2 ;;
    --nproc) nproc="$2"; shift 2 ;;
    --rate) rate="$2"; shift 2 ;;
    --delay) delay="$2"; shift 2 ;;
    --zero-run) zero_run="$2"; shift 2 ;;
    --name) name="$2"; shift 2 ;;
    --time-limit) time_limit="$2"; shift 2 ;;
    --launcher-arg) launcher_args+=("$2"); shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "netns-cluster: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "netns-cluster: missing PROGRAM" >&2; usage; }
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] ||
  { echo "netns-cluster: --nodes must be 1..200, got '$nodes'" >&2; exit 2; }
[[ "$time_limit" =~ ^[0-9]+$ ]] || { echo "netns-cluster: --time-limit must be whole seconds, got '$time_limit'" >&2; exit 2; }
[ -x "$zero_run" ] || { echo "netns-cluster: no launcher at $zero_run (build zero-run, or pass --zero-run)" >&2; exit 2; }
name="${name:-zc$$}"
[[ "$name" =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || { echo "netns-cluster: --name must be 1-40 of [A-Za-z0-9_.-]" >&2; exit 2; }

skip() { echo "netns-cluster: SKIP: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root (this is uid $(id -u))"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"

# A cluster whose script died without its trap (SIGKILL): namespaces named
# zc<pid>-* whose pid is gone, and those of a --name whose owner file
# ($owners/NAME.pid, the pid of the script that made them) names a pid that
# is gone. A cluster of that name whose owner still runs is not taken.
owners=/run/zero-netns-cluster
mkdir -p "$owners"
for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
  if [[ "$ns" =~ ^zc([0-9]+)-(hub|n[0-9]+)$ ]] && ! kill -0 "${BASH_REMATCH[1]}" 2>/dev/null; then
    ip netns del "$ns" 2>/dev/null || true
  fi
done
if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx -- "$name-hub"; then
  owner=$(cat "$owners/$name.pid" 2>/dev/null || true)
  if [[ "$owner" =~ ^[0-9]+$ ]] && kill -0 "$owner" 2>/dev/null; then
    echo "netns-cluster: a cluster named $name is running (pid $owner); choose another --name" >&2
    exit 2
  fi
  echo "netns-cluster: removing the namespaces of cluster $name, left by a run that ended without cleaning up" >&2
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in "$name-hub" | "$name"-n[0-9]*) ip netns del "$ns" 2>/dev/null || true ;; esac
  done
fi

hub="$name-hub"
made=()       # namespaces to remove
pids=()       # node launchers
cleaned=0
cleanup() {
  [ "$cleaned" = 1 ] && return
  cleaned=1
  trap '' INT TERM HUP
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  # zero-run gives its ranks 5 s after SIGTERM, then SIGKILL.
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  local ns
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -f "$owners/$name.pid"
}
trap cleanup EXIT
trap 'echo "netns-cluster: interrupted; stopping every node" >&2; exit 130' INT
trap 'echo "netns-cluster: terminated; stopping every node" >&2; exit 143' TERM HUP

make_ns() {
  local e
  e=$(ip netns add "$1" 2>&1) || skip "ip netns add failed: $e"
  made+=("$1")
  ip -n "$1" link set lo up
}

# The link's shape on one end (egress): netem for the delay when asked,
# with tbf under it for the rate; tbf alone otherwise. The burst is what
# tbf needs at this rate on a 1 ms timer (at least 64 KiB).
shape() {
  local ns="$1" dev="$2"
  if [ -n "$delay" ]; then
    tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null ||
      { echo "netns-cluster: --delay needs tc netem, which this kernel lacks (sch_netem)" >&2; exit 2; }
    tc -n "$ns" qdisc add dev "$dev" parent 1: handle 2: tbf rate "$rate" burst 256kb latency 50ms
  else
    tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 50ms
  fi
}

make_ns "$hub"
echo $$ > "$owners/$name.pid"
ip link add br0 netns "$hub" type bridge 2>/dev/null || skip "cannot create a bridge (no bridge support in this kernel?)"
ip -n "$hub" link set br0 up
for ((i = 0; i < nodes; ++i)); do
  ns="$name-n$i"
  make_ns "$ns"
  ip link add zc0 netns "$ns" type veth peer name "n$i" netns "$hub" 2>/dev/null ||
    skip "cannot create a veth pair (no veth support in this kernel?)"
  ip -n "$hub" link set "n$i" master br0
  ip -n "$hub" link set "n$i" up
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev zc0
  ip -n "$ns" link set zc0 up
  shape "$ns" zc0
  shape "$hub" "n$i"
done
echo "netns-cluster: $nodes node(s) x $nproc rank(s) in namespaces $name-n0..$((nodes - 1)), links $rate${delay:+ +$delay} each way" >&2

start=$(date +%s%N)
for ((i = 0; i < nodes; ++i)); do
  # setpriv --pdeathsig: a launcher whose script is killed outright stops too.
  GLOO_SOCKET_IFNAME=zc0 ip netns exec "$name-n$i" setpriv --pdeathsig TERM \
    "$zero_run" --nproc "$nproc" --nnodes "$nodes" --node-rank "$i" --master-addr 10.77.0.1 --master-port 29500 \
    "${launcher_args[@]}" -- "$@" &
  pids+=("$!")
done
if [ "$time_limit" -gt 0 ]; then
  (sleep "$time_limit"; echo "netns-cluster: time limit of $time_limit s reached; stopping every node" >&2
   kill -TERM "${pids[@]}" 2>/dev/null) &
  limiter=$!
fi

# Report each node as it ends (wait -n -p: bash 5.1).
status=0
declare -A node_of
for ((i = 0; i < nodes; ++i)); do node_of[${pids[$i]}]=$i; done
declare -A node_status
running=("${pids[@]}")
for ((k = 0; k < nodes; ++k)); do
  s=0
  wait -n -p done_pid "${running[@]}" || s=$?
  i=${node_of[$done_pid]}
  left=()
  for p in "${running[@]}"; do [ "$p" = "$done_pid" ] || left+=("$p"); done
  running=("${left[@]}")
  node_status[$i]=$s
  echo "netns-cluster: node $i exited with status $s after $(( ($(date +%s%N) - start) / 1000000 )) ms" >&2
done
pids=()
[ -n "${limiter:-}" ] && { kill "$limiter" 2>/dev/null || true; wait "$limiter" 2>/dev/null || true; }
for ((i = 0; i < nodes; ++i)); do
  # The hub's n<i> transmits what node i receives, and receives what it sends.
  read -r rx tx < <(ip -n "$hub" -s -j link show "n$i" |
    sed -n 's/.*"rx":{"bytes":\([0-9]*\).*"tx":{"bytes":\([0-9]*\).*/\1 \2/p')
  echo "netns-cluster: node $i link: sent ${rx:-?} bytes, received ${tx:-?} bytes" >&2
  if [ "$status" = 0 ] && [ "${node_status[$i]}" != 0 ]; then status=${node_status[$i]}; fi
done
exit "$status"
