# shellcheck shell=bash
# Sourced by scripts/install-deps (and tests/unit/test_debian_mirror.sh): the Debian mirror
# apt is configured with, found the way the base template build finds it
# (src/lib/control/template.c, host_mirror): the first "deb" source of SUITE in
# sources.list, then in sources.list.d/*.list and *.sources (deb822 stanzas; "Enabled: no"
# skipped), in name order; only http(s) URIs, no security archive, no blanks or controls.
# An air-gapped site's own mirror is used as it is configured; nothing is guessed.

# ok(URI) for awk: what may serve as the mirror (template.c's mirror_ok)
COVE_MIRROR_OK='
  function ok(u) {
    return u ~ /^https?:\/\// && u !~ /security/ && length(u) <= 200 && u !~ /[^[:graph:]]/
  }'

# one-line style: "deb [opts] URI SUITE COMPONENTS..."
cove_mirror_from_list() { # FILE SUITE
  [ -r "$1" ] || return 1
  awk -v want="$2" "$COVE_MIRROR_OK"'
    $1 == "deb" {
      i = 2
      if (substr($i, 1, 1) == "[") { # options, possibly several words, up to "]"
        while (i <= NF && index($i, "]") == 0) i++
        i++
      }
      if (i + 1 <= NF && $(i + 1) == want && ok($i)) { print $i; found = 1; exit }
    }
    END { exit !found }
  ' "$1"
}

# deb822: "Types: deb", "URIs: ...", "Suites: SUITE ...", optional "Enabled: no"
cove_mirror_from_sources() { # FILE SUITE
  [ -r "$1" ] || return 1
  awk -v want="$2" "$COVE_MIRROR_OK"'
    function flush() {
      if (deb && suite && enabled && uri != "") { print uri; found = 1; exit }
      deb = 0; suite = 0; enabled = 1; uri = ""
    }
    BEGIN { enabled = 1 }
    /^[ \t\r]*$/ { flush(); next }
    /^[ \t]*#/ { next }
    {
      i = index($0, ":"); if (i <= 1) next
      key = tolower(substr($0, 1, i - 1)); sub(/^[ \t]+/, "", key)
      n = split(substr($0, i + 1), v, /[ \t\r]+/)
      for (j = 1; j <= n; j++) {
        if (v[j] == "") continue
        if (key == "types" && v[j] == "deb") deb = 1
        else if (key == "uris" && uri == "" && ok(v[j])) uri = v[j]
        else if (key == "suites" && v[j] == want) suite = 1
        else if (key == "enabled" && tolower(v[j]) == "no") enabled = 0
      }
    }
    END { if (!found) { flush(); if (!found) exit 1 } }
  ' "$1"
}

# cove_debian_mirror [APT_DIR [SUITE]]: prints the mirror URI, or fails (status 1) saying
# where it looked. APT_DIR defaults to /etc/apt, SUITE to the host's codename (bookworm).
cove_debian_mirror() {
  local dir=${1:-/etc/apt} suite=${2:-} f
  if [ -z "$suite" ]; then
    suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
    suite=${suite:-bookworm}
  fi
  cove_mirror_from_list "$dir/sources.list" "$suite" && return 0
  for f in "$dir"/sources.list.d/*; do
    case "$f" in
      *.sources) cove_mirror_from_sources "$f" "$suite" && return 0 ;;
      *.list) cove_mirror_from_list "$f" "$suite" && return 0 ;;
    esac
  done
  echo "no Debian mirror for $suite in $dir/sources.list or $dir/sources.list.d/*.list," \
    "*.sources (an http(s) \"deb\" source of suite $suite)" >&2
  return 1
}
