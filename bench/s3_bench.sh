#!/usr/bin/env bash
# S3 chunk store vs the local directory, same data, same run: starts a throwaway radosgw
# (tests/lib/s3rgw.sh: mon + memstore OSD + rgw on this machine, objects in RAM), then runs
# chunkstore_bench against the local store (the anchor), against S3, against S3 with 8
# upload threads, and against S3 behind the node's local chunk cache. Prints the load.
#   bench/s3_bench.sh [MB (256)]      (root: the bench drops the page cache)
set -euo pipefail
cd "$(dirname "$0")/.."
MB=${1:-256}
B=${BUILD:-build}/bench/chunkstore_bench
[ -x "$B" ] || { echo "s3_bench: build first (make)" >&2; exit 1; }
D=$(mktemp -d)/rgw
trap 'tests/lib/s3rgw.sh stop "$D" >/dev/null 2>&1 || true; rmdir "$(dirname "$D")" 2>/dev/null || true' EXIT
PORT=$((12000 + RANDOM % 20000))
E=$(S3_RGW_MEM_BYTES=$(( (MB * 6 + 512) << 20 )) tests/lib/s3rgw.sh start "$D" "$PORT") || exit 1
export $E
echo "radosgw (Ceph $(radosgw --version | awk '{print $3}')) at $S3_ENDPOINT; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "## local directory (anchor)"
"$B" --mb "$MB" --idle-mb 32
run=$(date +%s)
echo "## S3 (radosgw), default threads"
"$B" --mb "$MB" --idle-mb 32 --store "s3://bench-$run-a" --s3-endpoint "$S3_ENDPOINT"
echo "## S3 (radosgw), 8 threads"
"$B" --mb "$MB" --idle-mb 32 --threads 8 --store "s3://bench-$run-b" --s3-endpoint "$S3_ENDPOINT"
echo "## S3 (radosgw) + local chunk cache (restore on the node that captured)"
"$B" --mb "$MB" --idle-mb 32 --store "s3://bench-$run-c" --s3-endpoint "$S3_ENDPOINT" --cache
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
