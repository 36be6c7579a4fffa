#!/usr/bin/env bash
# Two hosts on one machine: runs an MPI program with Open MPI over TCP
# between two network namespaces joined by a veth pair, so that the ranks
# talk as they would between two machines (no shared memory, no loopback).
#
#   scripts/netns_mpi.sh [-n RANKS_PER_HOST] [-x VAR]... [--print-bytes] -- PROGRAM ARGS...
#
#   -n N            ranks on each of the two hosts (default 1): 2N in all,
#                   ranks 0..N-1 on host A, N..2N-1 on host B
#   -x VAR[=VALUE]  pass VAR to the ranks as well (mpirun -x); OMP_NUM_THREADS,
#                   PATH, LD_LIBRARY_PATH, GOMP_SPINCOUNT, KMP_BLOCKTIME,
#                   OMP_WAIT_POLICY and
#                   the sanitizers' *SAN_OPTIONS go whenever they are set
#   --print-bytes   after the run, print the bytes the veth carried each way:
#                     netns bytes: A->B=N B->A=N
#                   (the transmit counters of each end, counted from just
#                   before mpirun started)
#
# What it does:
#   1. makes two network namespaces, kiln-a-PID and kiln-b-PID (PID is this
#      script's process id, so runs side by side do not collide), and a veth
#      pair kvaPID <-> kvbPID between them with the addresses 10.213.X.1/24
#      and 10.213.X.2/24 (X from the PID; the addresses exist only inside the
#      two namespaces, so they cannot clash with the machine's networks);
#   2. runs mpirun inside namespace A with a hostfile of the two addresses.
#      Open MPI starts its daemon on host B with scripts/netns_rsh.sh in place
#      of ssh, which enters namespace B (with a clean environment, like a
#      login). Each namespace also gets its own hostname (a UTS namespace)
#      when `unshare` can make one;
#   3. always removes the namespaces at the end (also on failure, Ctrl-C or
#      SIGTERM), ending any process still left inside them.
#
# The mpirun flags and why they are needed:
#   --mca plm_rsh_agent netns_rsh.sh   "ssh" into a namespace
#   --mca btl tcp,self                 ranks talk over TCP only (vader, the
#                                      shared-memory transport, is left out)
#   --mca btl_tcp_if_include SUBNET    the MPI traffic and Open MPI's own
#   --mca oob_tcp_if_include SUBNET    control channel use the veth's subnet
#   --bind-to none                     Open MPI binds each rank to a core by
#                                      default, counting cores per host: both
#                                      "hosts" would bind their rank to core 0
#                                      of this one machine
#   --allow-run-as-root                namespaces need root anyway
#
# Exit status: the program's (mpirun's); 77 when it cannot run here (not
# root, no `ip`, the kernel refuses namespaces, no Open MPI mpirun), with
# the reason on stderr; 2 on a usage error.
set -u

case "$0" in */*) here=${0%/*} ;; *) here=. ;; esac
here=$(cd "$here" && pwd)
me=netns_mpi.sh

usage() { # the lines of the header above that describe the usage; exit $1
  if [ "$1" = 0 ]; then sed -n '6,16p' "$0" | sed 's/^# \{0,1\}//'; else sed -n '6,16p' "$0" | sed 's/^# \{0,1\}//' >&2; fi
  exit "$1"
}
cannot() { # the machine cannot run this: exit 77 with the reason
  echo "$me: cannot run here: $*" >&2
  exit 77
}

per_host=1
print_bytes=0
extra_vars=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || usage 2; per_host=$2; shift 2 ;;
    -x) [ $# -ge 2 ] || usage 2; extra_vars+=("$2"); shift 2 ;;
    --print-bytes) print_bytes=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "$me: unknown option $1" >&2; usage 2 ;;
  esac
done
case "$per_host" in ''|*[!0-9]*|0) echo "$me: -n wants a count of 1 or more, got '$per_host'" >&2; exit 2 ;; esac
[ $# -ge 1 ] || { echo "$me: no program given after --" >&2; usage 2; }

# ---- can it run here? -----------------------------------------------------
[ "$EUID" = 0 ] || cannot "network namespaces and veth pairs need root (running as uid $EUID)"
command -v ip >/dev/null 2>&1 || cannot "no 'ip' command (iproute2 is not installed)"
command -v mpirun >/dev/null 2>&1 || cannot "no mpirun in PATH (Open MPI is not installed)"
mpirun --version 2>/dev/null | grep -q "Open MPI" ||
  cannot "mpirun is not Open MPI's ($(mpirun --version 2>&1 | head -n1)); the agent and --mca flags are Open MPI's"
[ -x "$here/netns_rsh.sh" ] || cannot "$here/netns_rsh.sh is missing or not executable"

tag=$$
ns_a=kiln-a-$tag
ns_b=kiln-b-$tag
if_a=kva$tag
if_b=kvb$tag
net=10.213.$((tag % 254 + 1))
addr_a=$net.1
addr_b=$net.2
made=()  # the namespaces this script made, for the clean-up
work=
mpirun_pid=

# Ends what is left inside our namespaces (politely, then for good) and
# removes them and the work directory. Deleting a namespace also deletes
# its end of the veth, which takes the other end with it.
# shellcheck disable=SC2317 # (the traps call these)
cleanup() {
  local ns pids _
  for ns in ${made[@]+"${made[@]}"}; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    if [ ${#pids[@]} -gt 0 ]; then
      kill -TERM "${pids[@]}" 2>/dev/null
      for _ in 1 2 3 4 5 6 7 8 9 10; do # up to 2 s to end
        mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
        [ ${#pids[@]} -gt 0 ] || break
        sleep 0.2
      done
      [ ${#pids[@]} -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null
    fi
    ip netns del "$ns" 2>/dev/null || echo "$me: could not remove namespace $ns" >&2
  done
  made=()
  if [ -n "$work" ]; then rm -rf "$work"; fi
}
# A signal: stop mpirun (it passes the signal on to the ranks), wait for
# it, then leave; the EXIT trap cleans up.
# shellcheck disable=SC2317
on_signal() {
  if [ -n "$mpirun_pid" ]; then
    kill -TERM "$mpirun_pid" 2>/dev/null
    wait "$mpirun_pid" 2>/dev/null
  fi
  exit "$1"
}
trap cleanup EXIT
trap 'on_signal 129' HUP
trap 'on_signal 130' INT
trap 'on_signal 143' TERM

# ---- the two hosts ----------------------------------------------------------
for ns in "$ns_a" "$ns_b"; do
  err=$(ip netns add "$ns" 2>&1) || cannot "the kernel refused a network namespace ($ns): $err"
  made+=("$ns")
done
echo "$me: namespaces $ns_a ($addr_a) and $ns_b ($addr_b)" >&2
# the veth is made with its two ends already in the namespaces, so no
# interface ever appears in the machine's own namespace
err=$(ip link add name "$if_a" netns "$ns_a" type veth peer name "$if_b" netns "$ns_b" 2>&1) ||
  cannot "could not make a veth pair: $err"
setup() { # NS IF ADDR
  ip -n "$1" link set lo up && ip -n "$1" addr add "$3/24" dev "$2" && ip -n "$1" link set "$2" up
}
err=$( { setup "$ns_a" "$if_a" "$addr_a" && setup "$ns_b" "$if_b" "$addr_b"; } 2>&1) ||
  cannot "could not configure the veth pair: $err"

# entering a namespace mounts its own /sys, which some containers forbid
for ns in "$ns_a" "$ns_b"; do
  err=$(ip netns exec "$ns" true 2>&1) || cannot "ip netns exec $ns failed: $err"
done

# one hostname per namespace, when unshare can make a UTS namespace
uts=0
if command -v unshare >/dev/null 2>&1 && unshare --uts -- true 2>/dev/null; then uts=1; fi

work=$(mktemp -d "${TMPDIR:-/tmp}/kiln_netns_XXXXXX") || { echo "$me: mktemp failed" >&2; exit 1; }
printf '%s slots=%d\n%s slots=%d\n' "$addr_a" "$per_host" "$addr_b" "$per_host" >"$work/hostfile"

# the environment the ranks get: host B's daemon starts with a clean one
xs=()
for v in OMP_NUM_THREADS PATH LD_LIBRARY_PATH GOMP_SPINCOUNT KMP_BLOCKTIME OMP_WAIT_POLICY ASAN_OPTIONS UBSAN_OPTIONS LSAN_OPTIONS ${extra_vars[@]+"${extra_vars[@]}"}; do
  case "$v" in
    *=*) xs+=(-x "$v") ;;                              # -x NAME=VALUE as given
    *) if [ -n "${!v+set}" ]; then xs+=(-x "$v"); fi ;; # NAME only when it is set
  esac
done

# what netns_rsh.sh reads (it is started by mpirun, so inherits these)
export KILN_NETNS_HOSTS="$addr_a=$ns_a $addr_b=$ns_b" KILN_NETNS_UTS=$uts

# a transmit counter of an interface, read in its namespace
counter() { # NS IF
  ip netns exec "$1" cat "/sys/class/net/$2/statistics/tx_bytes" 2>/dev/null || echo 0
}
tx_a0=$(counter "$ns_a" "$if_a")
tx_b0=$(counter "$ns_b" "$if_b")

launch=(ip netns exec "$ns_a")
if [ "$uts" = 1 ]; then
  # shellcheck disable=SC2016 # ($1 and $@ are the inner shell's)
  launch+=(unshare --uts -- sh -c 'echo "$1" > /proc/sys/kernel/hostname && shift && exec "$@"' netns-mpi "$ns_a")
fi
# mpirun in the background, so that a signal reaches this script's traps
# at once rather than after mpirun ends (its stdin is then /dev/null: rank
# 0 reads nothing from this terminal)
"${launch[@]}" mpirun --allow-run-as-root --hostfile "$work/hostfile" -np $((2 * per_host)) --bind-to none \
  --mca plm_rsh_agent "$here/netns_rsh.sh" --mca btl tcp,self \
  --mca btl_tcp_if_include "$net.0/24" --mca oob_tcp_if_include "$net.0/24" \
  ${xs[@]+"${xs[@]}"} "$@" &
mpirun_pid=$!
wait "$mpirun_pid"
rc=$?
mpirun_pid=

if [ "$print_bytes" = 1 ]; then
  tx_a=$(counter "$ns_a" "$if_a")
  tx_b=$(counter "$ns_b" "$if_b")
  echo "netns bytes: A->B=$((tx_a - tx_a0)) B->A=$((tx_b - tx_b0))"
fi
exit "$rc"
