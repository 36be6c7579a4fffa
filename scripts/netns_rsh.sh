#!/usr/bin/env bash
# The "ssh" of scripts/netns_mpi.sh: Open MPI starts its daemon (orted) on
# every host but its own through a remote-shell agent, called as
#   AGENT [ssh options] HOST COMMAND WORDS...
# (Open MPI 4.1 passes no options of its own to an agent that is not named
# ssh or rsh, but plm_rsh_args can add some, so they are accepted.) Here a
# "host" is a network namespace: the address is looked up in
# KILN_NETNS_HOSTS ("ADDR=NAMESPACE ADDR=NAMESPACE", set by netns_mpi.sh),
# and the command runs inside that namespace with `ip netns exec`.
#
# To behave like a login over ssh, the command
#   - runs in its own UTS namespace named after the namespace, so that each
#     host has its own hostname (Open MPI keys its session directories in
#     /tmp on the hostname) when KILN_NETNS_UTS is 1;
#   - gets a clean environment: only PATH, LD_LIBRARY_PATH, HOME, USER,
#     LOGNAME and TMPDIR, the way a remote shell's profile would set them.
#     Everything else the ranks need must come with `mpirun -x`, as it must
#     between real machines;
#   - is the words joined with spaces and run by sh -c, which is what ssh
#     does with its command words on the remote side.
# The exit status is the command's; 255 (ssh's own failure status) when
# the host is unknown or the arguments make no sense.
set -u

die() { echo "netns_rsh.sh: $*" >&2; exit 255; }

# ssh-style options before the host: those that take a value (as a
# separate word, or glued on as -p22 / -oName=value) and plain flags
while [ $# -gt 0 ]; do
  case "$1" in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOopQRSWw]) [ $# -ge 2 ] || die "option $1 needs a value"; shift 2 ;;
    -?*) shift ;; # a flag (-x, -q, -T, -4, ...) or an option with its value glued on
    *) break ;;
  esac
done
[ $# -ge 1 ] || die "no host given"
host=${1#*@} # user@host: the user is ignored (everything runs as the caller)
shift
[ $# -ge 1 ] || die "no command for $host (an interactive login is not supported)"

ns=
for pair in ${KILN_NETNS_HOSTS:-}; do
  if [ "${pair%%=*}" = "$host" ]; then ns=${pair#*=}; fi
done
[ -n "$ns" ] || die "host $host is not one of the namespaces (KILN_NETNS_HOSTS='${KILN_NETNS_HOSTS:-}')"

cmd="$*"
# the clean environment (env -i), keeping what a login would give
keep=(env -i "PATH=${PATH:-/usr/local/bin:/usr/bin:/bin}" "HOME=${HOME:-/root}")
for v in LD_LIBRARY_PATH USER LOGNAME TMPDIR; do
  if [ -n "${!v:-}" ]; then keep+=("$v=${!v}"); fi
done

if [ "${KILN_NETNS_UTS:-0}" = 1 ]; then
  # a UTS namespace of its own: the hostname is written through /proc,
  # which changes it only inside the new namespace
  # shellcheck disable=SC2016 # ($1 and $2 are the inner shell's)
  exec ip netns exec "$ns" unshare --uts -- "${keep[@]}" sh -c \
    'echo "$1" > /proc/sys/kernel/hostname && exec sh -c "$2"' netns-rsh "$ns" "$cmd"
fi
exec ip netns exec "$ns" "${keep[@]}" sh -c "$cmd"
