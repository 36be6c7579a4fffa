#!/usr/bin/env bash
# kiln train on several machines: a thin wrapper around Open MPI's mpirun
# with the defaults a multi-host run over TCP needs.
#
#   scripts/mpirun_hosts.sh HOSTFILE [options] -- /path/to/kiln train ARGS...
#
#   -n N          ranks in all (default: the sum of the slots in HOSTFILE)
#   --if NET      the network the ranks talk over: a subnet (10.1.0.0/16) or
#                 an interface name (eth1); sets btl_tcp_if_include and
#                 oob_tcp_if_include. Without it Open MPI tries every
#                 interface it finds, docker and VPN bridges included
#   --threads T   OMP_NUM_THREADS for every rank (default: $OMP_NUM_THREADS
#                 when it is set, else kiln gives each rank its host's cores
#                 divided by the ranks on that host)
#   --dry-run     print the mpirun command and run nothing
#   Any other option before -- goes to mpirun as it is (e.g. --prefix DIR,
#   --mca NAME VALUE, -x VAR).
#
# The hostfile: one line per machine, its name or address and how many
# ranks to start there (slots); '#' starts a comment:
#     node1 slots=2
#     node2 slots=2
# Ranks are handed out in order: 0 and 1 on node1, 2 and 3 on node2.
# Rank 0 is the first slot of the first line; run this on that machine.
#
# What every machine needs:
#   - ssh without a password from the machine that runs this to every other
#     one (mpirun starts its daemon, orted, over ssh: `ssh node2 which
#     orted` must print a path, from a non-interactive login). No daemon
#     has to run beforehand. If Open MPI is not in that login's PATH, pass
#     --prefix /its/install/dir.
#   - the same Open MPI version, and the same kiln build (built with MPI:
#     `make` uses mpicc when it finds it) at the same path on every machine,
#     or on a filesystem they all mount. Give absolute paths: the ranks on
#     other machines start in this directory if it exists there, else in
#     their home directory.
#   - the data: --data DIR (train.bin, val.bin) at the same path on every
#     machine; every rank reads its own micro-batches from the shards. A copy
#     per machine is fine (the shards are only read).
#   - the run directory: rank 0 writes --run-dir (checkpoints,
#     metrics.jsonl, loss.svg), with --shard every rank also writes its
#     optimizer shard into each checkpoint, and every rank reads the
#     checkpoint on `--resume` (and --init's run at the start), so put it on
#     a filesystem every machine sees (e.g. NFS). Without --shard a copy to
#     the same path on every machine before resuming also works.
#   - threads: each rank runs OMP_NUM_THREADS threads; set it (or
#     --threads) to the cores of a machine divided by its slots. This wraps
#     mpirun with --bind-to none: Open MPI's default binds each rank to one
#     core (two ranks or fewer) or one socket, which would squeeze a rank's
#     threads onto those.
#
# Stopping: Ctrl-C ends the job at once; `kill -USR1 <mpirun's pid>` makes
# every rank stop after the current step and rank 0 save.
#
# To try this without a second machine, scripts/netns_mpi.sh runs two
# "hosts" in two network namespaces on one machine (as root), with these
# same Open MPI settings; tests/test_netns.c trains through it.
#
# Exit status: mpirun's (the first failing rank's); 2 on a usage error.
set -u
me=mpirun_hosts.sh

usage() { # the usage lines of the header; exit $1
  if [ "$1" = 0 ]; then sed -n '5,18p' "$0" | sed 's/^# \{0,1\}//'; else sed -n '5,18p' "$0" | sed 's/^# \{0,1\}//' >&2; fi
  exit "$1"
}

[ $# -ge 1 ] || usage 2
case "$1" in -h|--help) usage 0 ;; esac
hostfile=$1
shift
[ -r "$hostfile" ] || { echo "$me: cannot read the hostfile '$hostfile'" >&2; exit 2; }

np=
net=
threads=${OMP_NUM_THREADS:-}
dry=0
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -n) [ $# -ge 2 ] || usage 2; np=$2; shift 2 ;;
    --if) [ $# -ge 2 ] || usage 2; net=$2; shift 2 ;;
    --threads) [ $# -ge 2 ] || usage 2; threads=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) extra+=("$1"); shift ;;
  esac
done
[ $# -ge 1 ] || { echo "$me: no program given after --" >&2; usage 2; }

# the ranks: the sum of slots= over the hostfile's lines (1 for a line
# without slots), comments and blank lines left out
if [ -z "$np" ]; then
  np=$(sed 's/#.*//' "$hostfile" | awk 'NF { n = 1; for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7) + 0; s += n } END { print s + 0 }')
fi
case "$np" in ''|*[!0-9]*|0) echo "$me: no ranks: give -n N or slots in '$hostfile'" >&2; exit 2 ;; esac
case "$threads" in *[!0-9]*) echo "$me: --threads wants a count, got '$threads'" >&2; exit 2 ;; esac

cmd=(mpirun --hostfile "$hostfile" -np "$np" --bind-to none)
if [ "$EUID" = 0 ]; then cmd+=(--allow-run-as-root); fi
# TCP between machines and shared memory between ranks on one machine,
# unless the caller chose the transports (e.g. UCX on InfiniBand)
case " ${extra[*]-} " in
  *" btl "*|*" pml "*) ;;
  *) cmd+=(--mca btl "self,vader,tcp") ;;
esac
if [ -n "$net" ]; then
  cmd+=(--mca btl_tcp_if_include "$net" --mca oob_tcp_if_include "$net")
fi
# the environment the ranks on other machines need (mpirun passes only
# what -x names; the ranks on this machine see it all anyway)
if [ -n "$threads" ]; then cmd+=(-x "OMP_NUM_THREADS=$threads"); fi
for v in PATH LD_LIBRARY_PATH GOMP_SPINCOUNT KMP_BLOCKTIME OMP_WAIT_POLICY; do
  if [ -n "${!v+set}" ]; then cmd+=(-x "$v"); fi
done
cmd+=(${extra[@]+"${extra[@]}"} "$@")

if [ "$dry" = 1 ]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
