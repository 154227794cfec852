#!/usr/bin/env bash
# Tests of scripts/lib/apt.sh on sample apt source files: the backports
# source is derived from the mirror the files name, in both formats.
# Run by .ci/run; prints `N passed, N failed`.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=scripts/lib/apt.sh
source ./apt.sh

dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
passed=0
failed=0
expect() { # NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    printf 'FAILED %s\n--- expected\n%s\n--- got\n%s\n' "$1" "$2" "$3"
  fi
}

cat >"$dir/debian.sources" <<'X'
Types: deb
# a comment inside a stanza
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
X
expect "deb822: the mirror of the release, its key" "Types: deb
URIs: http://mirror.example/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" "$(backports_stanza bookworm "$dir/debian.sources")"

cat >"$dir/sources.list" <<'X'
# deb http://commented.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/etc/apt/keyrings/k.gpg] http://other.example/debian bookworm main contrib
X
expect "one-line: options and deb-src skipped" "Types: deb
URIs: http://other.example/debian
Suites: bookworm-backports
Components: main
Signed-By: /etc/apt/keyrings/k.gpg" "$(backports_stanza bookworm "$dir/sources.list")"

printf 'deb http://mirror.example/debian bookworm-backports main\n' >"$dir/bpo.list"
expect "backports already configured: nothing" "" \
  "$(backports_stanza bookworm "$dir/debian.sources" "$dir/bpo.list")"

cat >"$dir/off.sources" <<'X'
Enabled: no
Types: deb
URIs: http://disabled.example/debian
Suites: bookworm
Components: main
X
expect "disabled stanza: no mirror, an error naming the file" \
  "no apt source serves 'bookworm' in: $dir/off.sources" \
  "$(backports_stanza bookworm "$dir/off.sources" 2>&1 || true)"

printf 'VERSION_CODENAME=bookworm\n' >"$dir/os-release"
expect "codename" "bookworm" "$(debian_codename "$dir/os-release")"

echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
