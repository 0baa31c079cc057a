#!/bin/sh
# The container's entrypoint: mounts SOURCE on MOUNTPOINT with tensorfs in the foreground.
#   tensorfs-entrypoint [SOURCE [MOUNTPOINT [OPTIONS]]]
# Arguments win over the variables TENSORFS_SOURCE, TENSORFS_MOUNTPOINT (the image sets
# /mnt/tensorfs/train) and TENSORFS_OPTIONS (the -o list, comma-separated, as in docs/options.md).
# Credentials come from AWS_*, GOOGLE_*, AZURE_* in the environment, as tensorfs reads them.
set -eu
SOURCE="${1:-${TENSORFS_SOURCE:-}}"
MNT="${2:-${TENSORFS_MOUNTPOINT:-/mnt/tensorfs/train}}"
OPTS="${3:-${TENSORFS_OPTIONS:-}}"
if [ -z "$SOURCE" ]; then
    echo "tensorfs-entrypoint: no source: pass SOURCE [MOUNTPOINT [OPTIONS]] or set TENSORFS_SOURCE" >&2
    exit 2
fi
# A sidecar killed with SIGKILL leaves a dead FUSE mount ("Transport endpoint is not
# connected") in the shared volume, and a new one could not mount over it: detach it first.
# Only a FUSE mount is touched, never a volume bound on MOUNTPOINT itself.
if findmnt -rn -t fuse,fuse.tensorfs --mountpoint "$MNT" >/dev/null 2>&1; then
    echo "tensorfs-entrypoint: detaching a FUSE mount left on $MNT" >&2
    umount -l "$MNT"
fi
mkdir -p "$MNT"
# exec: tensorfs replaces this shell as PID 1, so `docker stop` / pod deletion (SIGTERM)
# reaches it and it unmounts (with files still open, it detaches the mount instead).
if [ -n "$OPTS" ]; then
    exec tensorfs mount "$SOURCE" "$MNT" -o "$OPTS" --foreground
fi
exec tensorfs mount "$SOURCE" "$MNT" --foreground
