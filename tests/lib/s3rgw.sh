#!/usr/bin/env bash
# s3rgw.sh: a throwaway, real S3 server (Ceph radosgw from Debian) for the tests: one mon,
# one memstore OSD and one radosgw, every file under DIR, its own fsid and ports, no
# systemd, no mgr and nothing under /etc/ceph or /var/*/ceph, so several run side by side.
#
#   s3rgw.sh start DIR PORT   DIR must not exist yet; prints one line for `export`:
#       AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… S3_ENDPOINT=http://ADDR:PORT AWS_REGION=us-east-1
#     and returns once a signed ListBuckets answers 200. On failure it stops what it
#     started, keeps DIR with its logs and names the log to read.
#   s3rgw.sh stop DIR         stops the recorded daemons one at a time (rgw, osd, mon:
#     TERM, KILL after 10 s; each PID checked against DIR first, never by name), then
#     removes DIR if it holds this script's marker file.
#   s3rgw.sh pause|resume DIR stops / starts radosgw alone (fault tests: "the store is
#     down"); the cluster and its objects stay.
#
# Environment: S3_RGW_ADDR (local address, default 127.0.0.1), S3_RGW_WAIT (seconds per
# stage, default 90), S3_RGW_MEM_BYTES (memstore size, default 2 GiB: the objects live in
# the OSD's RAM and a full store makes writes hang), S3_RGW_ACCESS_KEY/S3_RGW_SECRET_KEY.
# Needs ceph-mon ceph-osd radosgw curl iproute2 (scripts/install-deps).
set -euo pipefail
unset CEPH_ARGS CEPH_CONF

AK=${S3_RGW_ACCESS_KEY:-COVETESTACCESSKEY001}
SK=${S3_RGW_SECRET_KEY:-covetestsecret0000000000000000000000000001}
ADDR=${S3_RGW_ADDR:-127.0.0.1}
WAIT=${S3_RGW_WAIT:-90}
MEM=${S3_RGW_MEM_BYTES:-2147483648}
MARK=.cove-s3rgw
D=""; STARTED=0

die() { echo "s3rgw.sh: $*" >&2; exit 1; }
usage() { echo "usage: $0 start DIR PORT | stop DIR | pause DIR | resume DIR" >&2; exit 2; }

addr_is_local() { # never listen on an address that is not ours
    case "$1" in 127.*) return 0 ;; esac
    ip -o -4 addr show 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | grep -qxF -- "$1"
}
port_busy() { [ -n "$(ss -Hltn "( sport = :$1 )" 2>/dev/null)" ]; }

# alive, and its command line names DIR/ceph.conf (guards against PID reuse; a zombie has
# an empty command line and counts as gone)
pid_is_ours() {
    [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"
}

stop_pid() { # NAME PID CONF: TERM, wait up to 10 s, KILL
    local name=$1 pid=$2 conf=$3
    pid_is_ours "$pid" "$conf" || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 200); do
        pid_is_ours "$pid" "$conf" || return 0
        sleep 0.05
    done
    echo "s3rgw.sh: $name (pid $pid) ignored SIGTERM for 10 s; SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        pid_is_ours "$pid" "$conf" || return 0
        sleep 0.05
    done
}

# newest first (rgw, osd, mon), one at a time: all at once takes ~5 s instead of ~0.4 s
kill_recorded() {
    local dir=$1 name pid
    [ -f "$dir/pids" ] || return 0
    tac "$dir/pids" | while read -r name pid; do stop_pid "$name" "$pid" "$dir/ceph.conf"; done
}

launch() { # NAME CMD...: a foreground daemon in its own session; setsid execs, so $! is it
    local name=$1; shift
    setsid "$@" </dev/null >"$D/log/$name.out" 2>&1 &
    local pid=$!
    echo "$name $pid" >>"$D/pids"
    disown "$pid" 2>/dev/null || true
    for _ in $(seq 1 250); do # until exec, /proc/PID/cmdline is still ours
        pid_is_ours "$pid" "$D/ceph.conf" && return 0
        [ -e "/proc/$pid" ] || return 0
        sleep 0.02
    done
}

fail() { echo "s3rgw.sh: start failed: $*" >&2; exit 1; }

alive_or_fail() {
    local name pid
    while read -r name pid; do
        pid_is_ours "$pid" "$D/ceph.conf" && continue
        fail "$name (pid $pid) exited; read $D/log/$name.log and $D/log/$name.out"
    done <"$D/pids"
}

on_exit() { # a start that did not finish stops what it began
    local rc=$?
    if [ "$STARTED" = 0 ] && [ -n "$D" ] && [ -f "$D/$MARK" ]; then
        kill_recorded "$D"
        echo "s3rgw.sh: daemons stopped; logs kept in $D/log; remove with: $0 stop $D" >&2
    fi
    exit $rc
}

s3_status() { # HTTP status of a signed ListBuckets
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 --aws-sigv4 "aws:amz:us-east-1:s3" \
        --user "$AK:$SK" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "http://$1/" || true
}

wait_http() { # ADDR:PORT LOG: until rgw answers at all
    local deadline=$((SECONDS + WAIT))
    while alive_or_fail; ! curl -s -o /dev/null --max-time 2 "http://$1/"; do
        [ $SECONDS -lt $deadline ] || fail "rgw not answering on $1 after ${WAIT}s; read $2"
        sleep 0.1
    done
}

start() {
    [ $# = 2 ] || usage
    local dir; dir=$(realpath -m -- "$1"); PORT=$2
    [[ $dir =~ ^[A-Za-z0-9._/+-]+$ ]] || die "DIR may only hold A-Z a-z 0-9 . _ / + - (got '$dir')"
    [[ $PORT =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || die "bad PORT '$PORT'"
    addr_is_local "$ADDR" || die "S3_RGW_ADDR=$ADDR is not an address of this host"
    [ -e "$dir" ] && die "$dir already exists (stop it with '$0 stop $dir', or pick a new DIR)"
    for b in ceph ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool curl ss; do
        command -v $b >/dev/null || die "$b not found (scripts/install-deps installs ceph-mon ceph-osd radosgw)"
    done
    port_busy "$PORT" && die "port $PORT is already in use"
    local MONPORT=""
    for _ in $(seq 1 100); do # below the ephemeral range, where no client socket holds it
        MONPORT=$((10000 + RANDOM % 22768))
        [ "$MONPORT" != "$PORT" ] && ! port_busy "$MONPORT" && break
        MONPORT=""
    done
    [ -n "$MONPORT" ] || die "no free port for the mon"

    mkdir -p -- "$(dirname -- "$dir")"
    mkdir -- "$dir" || die "cannot create $dir"
    D=$dir
    trap on_exit EXIT
    trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP
    echo "port=$PORT monport=$MONPORT addr=$ADDR" >"$D/$MARK"
    : >"$D/pids"
    mkdir "$D/log" "$D/run" "$D/mon" "$D/osd" "$D/rgw" "$D/crash"
    local FSID OSDUUID C="$D/ceph.conf"
    FSID=$(cat /proc/sys/kernel/random/uuid); OSDUUID=$(cat /proc/sys/kernel/random/uuid)
    cat >"$C" <<CONF
[global]
fsid = $FSID
# msgr v1 only: with a port other than 6789 a bare address would mean msgr2
mon host = v1:127.0.0.1:$MONPORT
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
mon warn on insecure global id reclaim allowed = false
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
# by default the mon stops itself below 5% free disk
mon data avail crit = 0
osd objectstore = memstore
memstore device bytes = $MEM
osd crush chooseleaf type = 0
# with auth none the OSD's crush/device-class commands at init can reach the mon before
# it has the monmap, and the OSD exits; the CRUSH entry is added below instead
osd crush update on start = false
osd class update on start = false
run dir = $D/run
log file = $D/log/\$name.log
mon cluster log file = $D/log/cluster.log
admin socket = $D/run/\$name.asok
pid file = $D/run/\$name.pid
crash dir = $D/crash
keyring = $D/keyring
mon data = $D/mon
osd data = $D/osd
rgw data = $D/rgw
rgw luarocks location = $D/rgw/luarocks
# every pool rgw creates costs one paxos round (1 s each by default)
paxos propose interval = 0.05
paxos min wait = 0.01
[client.rgw.a]
rgw frontends = beast endpoint=$ADDR:$PORT
rgw thread pool size = 32
CONF
    local mk="$D/log/mkfs.out"
    monmaptool --create --fsid "$FSID" --addv a "[v1:127.0.0.1:$MONPORT]" "$D/monmap" >"$mk" 2>&1 ||
        fail "monmaptool; read $mk"
    ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >>"$mk" 2>&1 ||
        fail "ceph-authtool; read $mk"
    ceph-mon -c "$C" --mkfs -i a --monmap "$D/monmap" --keyring "$D/keyring" >>"$mk" 2>&1 ||
        fail "ceph-mon --mkfs; read $mk"
    launch mon.a ceph-mon -c "$C" -i a -f
    # register osd.0 and place it in CRUSH; the CLI may race the monmap too (EPERM), and
    # with commands on stdin it exits 0 even when one fails: check its output
    local deadline=$((SECONDS + WAIT)) out="$D/log/osd-create.out"
    while alive_or_fail; ! {
            printf 'osd create %s\nosd crush add osd.0 1.0 root=default\n' "$OSDUUID" |
                timeout 20 ceph -c "$C" --connect-timeout 15 >"$out" 2>&1 &&
                ! grep -q '^Error' "$out" && grep -q "name 'osd.0'" "$out"; }; do
        cat "$out" >>"$mk"
        [ $SECONDS -lt $deadline ] || fail "'ceph osd create' kept failing for ${WAIT}s; read $out"
        sleep 0.2
    done
    ceph-osd -c "$C" -i 0 --mkfs --osd-uuid "$OSDUUID" >>"$mk" 2>&1 || fail "ceph-osd --mkfs; read $mk"
    launch osd.0 ceph-osd -c "$C" -i 0 -f
    launch client.rgw.a radosgw -c "$C" -n client.rgw.a -f
    wait_http "$ADDR:$PORT" "$D/log/client.rgw.a.log"
    timeout "$WAIT" radosgw-admin -c "$C" user create --uid=test --display-name=test \
        --access-key="$AK" --secret-key="$SK" >"$D/log/user-create.out" 2>&1 ||
        fail "radosgw-admin user create; read $D/log/user-create.out"
    deadline=$((SECONDS + WAIT))
    while alive_or_fail; [ "$(s3_status "$ADDR:$PORT")" != 200 ]; do
        [ $SECONDS -lt $deadline ] || fail "signed ListBuckets not 200 after ${WAIT}s; read $D/log/client.rgw.a.log"
        sleep 0.1
    done
    STARTED=1
    echo "AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK S3_ENDPOINT=http://$ADDR:$PORT AWS_REGION=us-east-1"
}

own_dir() { # DIR → realpath, refusing a directory this script did not make
    local dir; dir=$(realpath -m -- "$1")
    [ -f "$dir/$MARK" ] || die "$dir has no $MARK: not made by '$0 start'; refusing to touch it"
    echo "$dir"
}

stop() {
    [ $# = 1 ] || usage
    local dir name pid; dir=$(realpath -m -- "$1")
    if [ ! -e "$dir" ]; then echo "s3rgw.sh: $dir does not exist; nothing to stop" >&2; return 0; fi
    dir=$(own_dir "$dir")
    kill_recorded "$dir"
    while read -r name pid; do
        pid_is_ours "$pid" "$dir/ceph.conf" && die "$name (pid $pid) survived SIGKILL; $dir kept"
    done <"$dir/pids"
    rm -rf -- "$dir"
}

pause() {
    [ $# = 1 ] || usage
    local dir name pid; dir=$(own_dir "$1")
    while read -r name pid; do
        [ "$name" = client.rgw.a ] && stop_pid "$name" "$pid" "$dir/ceph.conf"
    done <"$dir/pids"
    return 0
}

resume() {
    [ $# = 1 ] || usage
    local dir; dir=$(own_dir "$1")
    D=$dir
    local addrport; addrport=$(sed -n 's/.*endpoint=\([^ ]*\).*/\1/p' "$D/ceph.conf")
    grep -v '^client.rgw.a ' "$D/pids" >"$D/pids.new" || true
    mv "$D/pids.new" "$D/pids"
    launch client.rgw.a radosgw -c "$D/ceph.conf" -n client.rgw.a -f
    wait_http "$addrport" "$D/log/client.rgw.a.log"
    local deadline=$((SECONDS + WAIT))
    while [ "$(s3_status "$addrport")" != 200 ]; do
        [ $SECONDS -lt $deadline ] || die "rgw back but signed ListBuckets not 200; read $D/log/client.rgw.a.log"
        sleep 0.1
    done
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    pause) shift; pause "$@" ;;
    resume) shift; resume "$@" ;;
    *) usage ;;
esac
