# Runs inside `unshare`'s new namespaces as the namespace's root (the sandbox's fallback when bwrap is missing):
# builds the minimal tree in a tmpfs, pivots into it, drops every capability and execs the runner ("$@").
# Its inputs come in the environment: RLMESH_ROOT (an empty mount point), RLMESH_BINDS (paths bound read-only,
# one a line), RLMESH_LINKS (link=target, one a line), RLMESH_SCRATCH_BYTES (the size of /tmp and /dev/shm).
set -eu
R="$RLMESH_ROOT"
mount -t tmpfs -o size=1m,mode=755 rlmesh-root "$R"
mkdir -p "$R/tmp"
mount -t tmpfs -o "size=$RLMESH_SCRATCH_BYTES,mode=1777" rlmesh-scratch "$R/tmp"  # first: binds under /tmp land on it
IFS='
'
for p in $RLMESH_BINDS; do
    if [ -d "$p" ]; then mkdir -p "$R$p"; else mkdir -p "$R${p%/*}"; : > "$R$p"; fi
    mount --bind "$p" "$R$p"
    mount -o remount,bind,ro "$R$p"
done
for link in $RLMESH_LINKS; do ln -s "${link#*=}" "$R${link%%=*}"; done
mkdir -p "$R/dev" "$R/proc"
mount -t tmpfs -o size=64k,mode=755 rlmesh-dev "$R/dev"
for device in null zero full random urandom; do : > "$R/dev/$device"; mount --bind "/dev/$device" "$R/dev/$device"; done
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir "$R/dev/shm"
mount -t tmpfs -o "size=$RLMESH_SCRATCH_BYTES,mode=1777" rlmesh-shm "$R/dev/shm"
mount -o remount,ro,bind "$R/dev"
mount -t proc proc "$R/proc"
mount -o remount,ro,bind "$R"
cd "$R"
pivot_root . .
umount -l .
cd /tmp
exec setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
