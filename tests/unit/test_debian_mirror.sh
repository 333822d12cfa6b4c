#!/usr/bin/env bash
# scripts/debian-mirror.sh against fake apt configurations: the mirror comes from apt's
# sources (one-line and deb822, the order and filters of the base template build), a
# configuration without one fails with a message, and scripts/install-deps names no host
# of its own. Reads files only: nothing is downloaded.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=scripts/debian-mirror.sh
. "$here/../../scripts/debian-mirror.sh"
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
fails=0
check() { # NAME WANT DIR
  local got
  got=$(cove_debian_mirror "$3" bookworm 2>"$t/err")
  if [ "$got" = "$2" ]; then
    echo "ok - $1"
  else
    echo "not ok - $1: got '$got' want '$2' ($(cat "$t/err"))"
    fails=$((fails + 1))
  fi
}
mk() { mkdir -p "$t/$1/sources.list.d"; }

# one-line sources.list: comments, the security archive, another suite, ftp and options
mk a
cat >"$t/a/sources.list" <<'X'
# deb http://commented.example/debian bookworm main
deb http://security.example/debian-security bookworm-security main
deb http://deb.example/debian-security bookworm main
deb ftp://ftp.example/debian bookworm main
deb http://other-suite.example/debian trixie main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.a.example/debian bookworm main
deb http://later.example/debian bookworm main
X
check "one-line: first http(s) deb source of the suite, options skipped" \
  "http://mirror.a.example/debian" "$t/a"

# sources.list without one: sources.list.d in name order, deb822 filters
mk b
printf '# nothing here\n' >"$t/b/sources.list"
cat >"$t/b/sources.list.d/10-first.sources" <<'X'
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
Enabled: no

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
URIs: http://deb.example/debian
Suites: trixie
X
cat >"$t/b/sources.list.d/20-second.list" <<'X'
deb [trusted=yes] https://mirror.b.example/debian/ bookworm main
X
cat >"$t/b/sources.list.d/30-third.sources" <<'X'
Types: deb
URIs: http://too-late.example/debian
Suites: bookworm
X
check "sources.list.d: disabled, deb-src and other suites skipped; *.list in order" \
  "https://mirror.b.example/debian/" "$t/b"

# deb822: several URIs (the first usable), several suites, the stanza at end of file
mk c
cat >"$t/c/sources.list.d/debian.sources" <<'X'
Types: deb
# a comment inside the stanza
URIs: file:/srv/local https://mirror.c.example/debian http://second.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
X
check "deb822: first http(s) URI of the stanza" "https://mirror.c.example/debian" "$t/c"

# files that are neither *.list nor *.sources are not read (as apt does)
mk d
printf 'deb http://ignored.example/debian bookworm main\n' >"$t/d/sources.list.d/x.list.disabled"
printf 'deb http://mirror.d.example/debian bookworm main\n' >"$t/d/sources.list.d/y.list"
check "only *.list and *.sources" "http://mirror.d.example/debian" "$t/d"

# none: status 1 and a message saying where it looked
mk e
printf 'deb http://deb.example/debian-security bookworm-security main\n' >"$t/e/sources.list"
if out=$(cove_debian_mirror "$t/e" bookworm 2>&1); then
  echo "not ok - no mirror: succeeded with '$out'"
  fails=$((fails + 1))
elif [[ "$out" == *"no Debian mirror for bookworm in $t/e/sources.list"* ]]; then
  echo "ok - no mirror: fails with a message"
else
  echo "not ok - no mirror: message '$out'"
  fails=$((fails + 1))
fi

# install-deps takes its hosts from apt's configuration only
if grep -nE 'https?://' "$here/../../scripts/install-deps" | grep -v '^[0-9]*:[[:space:]]*#'; then
  echo "not ok - install-deps names a host of its own (above)"
  fails=$((fails + 1))
else
  echo "ok - install-deps names no host of its own"
fi
exit $((fails > 0))
