#!/bin/sh
# Readiness check: exits 0 once MOUNTPOINT is mounted and MOUNTPOINT/dataset.json reads.
#   tensorfs-ready [MOUNTPOINT [WAIT_SECONDS]]
# MOUNTPOINT defaults to TENSORFS_MOUNTPOINT; with WAIT_SECONDS it retries each second for that
# long (as a Kubernetes probe, give none: the kubelet does the retrying).
set -u
MNT="${1:-${TENSORFS_MOUNTPOINT:-/mnt/tensorfs/train}}"
WAIT="${2:-0}"
end=$(( $(date +%s) + WAIT ))
while :; do
    # mountpoint: a dataset.json left in the plain directory does not count.
    # timeout: a daemon that stops answering fails the check instead of hanging it; a dead
    # mount fails at once (ENOTCONN).
    # shellcheck disable=SC2016  # $1 expands in the inner shell
    if err="$(timeout 10 sh -c 'mountpoint "$1" >/dev/null 2>&1 || { mountpoint "$1"; exit 1; }
                               head -c 1 "$1/dataset.json" >/dev/null' - "$MNT" 2>&1)"; then
        exit 0
    fi
    [ "$(date +%s)" -lt "$end" ] || break
    sleep 1
done
echo "tensorfs-ready: $MNT/dataset.json cannot be read: ${err:-timed out}" >&2
exit 1
