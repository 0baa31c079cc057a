#!/bin/sh
# Checks mount.fuse.tensorfs's option filtering: runs it with TENSORFS_BIN set to a fake that
# prints its arguments, one per line, and compares. Exits non-zero on any mismatch.

set -eu

here=$(cd "$(dirname "$0")" && pwd)
helper=$here/mount.fuse.tensorfs
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fake=$tmp/tensorfs
cat >"$fake" <<'FAKE'
#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done
FAKE
chmod +x "$fake"
# A file an unquoted glob in the helper would expand `columns=*` to.
touch "$tmp/columns=oops"
cd "$tmp"

failures=0

# check NAME EXPECTED ARGS...: EXPECTED is the fake's argv joined by '|'.
check() {
    name=$1
    expected=$2
    shift 2
    if ! got=$(TENSORFS_BIN=$fake "$helper" "$@" 2>"$tmp/stderr" | paste -sd'|' -); then
        got="(exit non-zero: $(cat "$tmp/stderr"))"
    fi
    if [ "$got" = "$expected" ]; then
        echo "ok   $name"
    else
        echo "FAIL $name"
        echo "     expected: $expected"
        echo "     got:      $got"
        failures=$((failures + 1))
    fi
}

# check_fails NAME ARGS...: the helper must exit non-zero without running tensorfs.
check_fails() {
    name=$1
    shift
    if out=$(TENSORFS_BIN=$fake "$helper" "$@" 2>/dev/null); then
        echo "FAIL $name: exited 0 (output: $out)"
        failures=$((failures + 1))
    elif [ -n "$out" ]; then
        echo "FAIL $name: ran tensorfs (output: $out)"
        failures=$((failures + 1))
    else
        echo "ok   $name"
    fi
}

check "fstab line" \
    "/data/train|/mnt/train|-o|batch_size=1024,epochs=10,cache_dir=/var/cache/tensorfs" \
    /data/train /mnt/train -o batch_size=1024,epochs=10,cache_dir=/var/cache/tensorfs,nofail,_netdev

check "only generic options: no -o" \
    "/data/train|/mnt/train" \
    /data/train /mnt/train -o defaults,rw,nofail,_netdev,noauto,user,nodev,nosuid,noexec,noatime

check "no options at all" \
    "/data/train|/mnt/train" \
    /data/train /mnt/train

check "every generic option dropped, order of the rest kept" \
    "src|dir|-o|seed=7,drop_last,shuffle=global,allow_other" \
    src dir -o "defaults,seed=7,group,nodiratime,diratime,loud,silent,auto,noauto,user,users,nouser,owner,nofail,_netdev,rw,ro,dev,nodev,suid,nosuid,exec,noexec,atime,noatime,relatime,strictatime,sync,async,drop_last,comment=systemd.automount,x-systemd.automount,x-systemd.requires=network-online.target,x-gvfs-show,user=alice,shuffle=global,allow_other"

check "mount(8) flags ignored" \
    "s3://bucket/train/|/mnt/s3|-o|aws_endpoint=http://127.0.0.1:9000,aws_allow_http=true" \
    -n -v s3://bucket/train/ /mnt/s3 -s -o rw,aws_endpoint=http://127.0.0.1:9000,aws_allow_http=true,_netdev

check "-t TYPE and -N NS skipped" \
    "src|dir|-o|batch_size=64" \
    src dir -t fuse.tensorfs -N /proc/1/ns/mnt -o batch_size=64

check "lists inside values kept whole" \
    "src|dir|-o|columns=a:b:c,stack=xyz:x+y+z,cast=a:float16,cast=b:int32,pad=tokens:128" \
    src dir -o columns=a:b:c,stack=xyz:x+y+z,cast=a:float16,cast=b:int32,pad=tokens:128,relatime

check "repeated -o and -oOPTS merged, empty options dropped" \
    "src|dir|-o|epochs=3,world_size=8,log=debug" \
    src dir -o epochs=3,,ro -oworld_size=8 -o ,log=debug,

check "no glob expansion" \
    "src|dir|-o|columns=*" \
    src dir -o "columns=*"

check "an escaped comma stays in its value, even before a generic option's name" \
    'src|dir|-o|columns=a\,ro,seed=1,stack=s:b\\,cast=x\,y:float16' \
    src dir -o 'columns=a\,ro,seed=1,nodev,stack=s:b\\,cast=x\,y:float16'

check "-f (fake) mounts nothing" "" -f src dir -o batch_size=8

check_fails "missing mountpoint" src
check_fails "too many operands" src dir extra
check_fails "-o without a value" src dir -o

if [ "$failures" -ne 0 ]; then
    echo "$failures case(s) failed" >&2
    exit 1
fi
echo "all cases passed"
