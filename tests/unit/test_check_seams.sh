#!/usr/bin/env bash
# scripts/check-seams.sh: the repository's control plane keeps to its seam, and the check
# itself fails on each kind of reach-through (an include of runtime/, net/, api/ or
# store/snapshot.h; a call of a layer, full-snapshot, capture, store or gateway function)
# while comments that name such functions pass. Reads files only.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
check="$root/scripts/check-seams.sh"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
want() { # NAME WANT_RC ROOT
  "$check" "$3" >"$t/out" 2>&1
  local rc=$?
  if [ "$rc" = "$2" ]; then
    echo "ok - $1"
  else
    echo "not ok - $1: exit $rc, want $2: $(cat "$t/out")"
    fails=$((fails + 1))
  fi
}
case_() { # NAME WANT_RC TEXT
  rm -rf "$t/r" && mkdir -p "$t/r/src/lib/control"
  printf '%s\n' "$3" >"$t/r/src/lib/control/x.c"
  want "$1" "$2" "$t/r"
}

want "this repository's src/lib/control keeps to the seam" 0 "$root"
case_ "node headers are the way through" 0 '#include "node/node.h"
#include "node/tm.h"
#include "store/catalog.h"
int f(void) { return cove_node_tm_ready(0); }'
case_ "a comment may name a node internal" 0 '/* the node calls cove_node_layer_open() for us */
int f(void); // cove_gateway_attach( is behind node/egress.h'
case_ "include of net/" 1 '#include "net/gateway.h"'
case_ "include of runtime/" 1 ' #  include "runtime/vm.h"'
case_ "include of api/" 1 '#include "api/http.h"'
case_ "include of store/snapshot.h" 1 '#include "store/snapshot.h"'
case_ "call of a layer image function" 1 'int f(void) { return cove_node_layer_open(n, i, 0, 0, 0, 0, 0, 0); }'
case_ "call of a full snapshot function" 1 'int f(void) { return cove_node_full_dump (n, 0, 0, 0, 0, 0, 0); }'
case_ "call of snapshot capture" 1 'int f(void) { return cove_snapshot_capture_tree(s, 0, 0, 0, 0, 0, 0); }'
case_ "call of the gateway" 1 'void f(void) { cove_gateway_detach(g, "x"); }'
case_ "call of the store" 1 'void f(void) { cove_store_gc(s, 0, 0, 0, 0, 0); }'
named() { # NAME WANT_RC FILE TEXT: the allowances name one file and one header each
  rm -rf "$t/r" && mkdir -p "$t/r/src/lib/control"
  printf '%s\n' "$4" >"$t/r/src/lib/control/$3"
  want "$1" "$2" "$t/r"
}
named "control/ports.c's allowance is net/ports.h" 0 ports.c '#include "net/ports.h"'
named "control/ports.c's allowance is net/ports.h only" 1 ports.c '#include "net/gateway.h"'
named "another file does not get ports.c's allowance" 1 x.c '#include "net/ports.h"'
named "control/snapdiff.c's allowance is store/snapshot.h only" 1 snapdiff.c '#include "net/ports.h"'
named "control/snapdiff.c still may not capture" 1 snapdiff.c '#include "store/snapshot.h"
int f(void) { return cove_snapshot_capture_tree(s, 0, 0, 0, 0, 0, 0); }'
if [ "$fails" -ne 0 ]; then
  echo "$fails failed"
  exit 1
fi
