# shellcheck shell=bash
# Debian package helpers for scripts/test and .ci/run, sourced by them.
#
# No package host is written here: the backports source is derived from
# the Debian mirror the machine's apt sources already name, in both the
# one-line format (/etc/apt/sources.list, *.list) and deb822 (*.sources).

# The apt source files of this machine.
apt_source_files() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && printf '%s\n' "$f"
  done
  return 0
}

# Prints one line per (type, URI, suite) the files declare:
# `TYPE URI SUITE SIGNED_BY` (SIGNED_BY is `-` when none is given).
# Disabled deb822 stanzas (`Enabled: no`) and comments are left out.
apt_source_records() {
  local f
  for f in "$@"; do
    case "$f" in
      *.sources) awk '
        function flush(   t, u, s, nt, nu, ns, i, j, k) {
          if (enabled != "no" && types != "" && uris != "" && suites != "") {
            nt = split(types, t, " "); nu = split(uris, u, " "); ns = split(suites, s, " ")
            for (i = 1; i <= nt; i++) for (j = 1; j <= nu; j++) for (k = 1; k <= ns; k++)
              print t[i], u[j], s[k], (signed == "" ? "-" : signed)
          }
          types = uris = suites = signed = enabled = ""
        }
        /^[ \t]*#/ { next }
        /^[ \t]*$/ { flush(); next }
        {
          key = tolower($1); sub(/:$/, "", key)
          value = $0; sub(/^[^:]*:[ \t]*/, "", value)
          if (key == "types") types = value
          else if (key == "uris") uris = value
          else if (key == "suites") suites = value
          else if (key == "signed-by") signed = value
          else if (key == "enabled") enabled = tolower(value)
        }
        END { flush() }' "$f" ;;
      *) awk '
        /^[ \t]*(deb|deb-src)[ \t]/ {
          signed = "-"; i = 2
          if ($2 ~ /^\[/) {
            for (; i <= NF; i++) {
              if ($i ~ /^\[?signed-by=/) { signed = $i; sub(/^\[?signed-by=/, "", signed); sub(/\]$/, "", signed) }
              if ($i ~ /\]$/) { i++; break }
            }
          }
          print $1, $(i), $(i + 1), signed
        }' "$f" ;;
    esac
  done
}

# The release codename from os-release (`bookworm`), or nothing.
debian_codename() {
  local file="${1:-/etc/os-release}"
  [ -f "$file" ] || return 0
  sed -n 's/^VERSION_CODENAME=//p' "$file" | tr -d '"'
}

# Prints the deb822 stanza of CODENAME-backports on the mirror that FILES
# name for CODENAME itself; prints nothing when FILES already have the
# backports suite. Fails, naming the files, when no mirror serves CODENAME.
backports_stanza() {
  local codename="$1"; shift
  local records mirror
  records="$(apt_source_records "$@")"
  if awk -v s="$codename-backports" '$1 == "deb" && $3 == s { found = 1 } END { exit !found }' <<<"$records"; then
    return 0
  fi
  mirror="$(awk -v s="$codename" '$1 == "deb" && $3 == s { print $2, $4; exit }' <<<"$records")"
  if [ -z "$mirror" ]; then
    echo "no apt source serves '$codename' in: $*" >&2
    return 1
  fi
  printf 'Types: deb\nURIs: %s\nSuites: %s-backports\nComponents: main\n' "${mirror% *}" "$codename"
  if [ "${mirror#* }" != "-" ]; then
    printf 'Signed-By: %s\n' "${mirror#* }"
  fi
}

# Where the derived backports source is written.
# shellcheck disable=SC2034 # used by the scripts that source this file
BACKPORTS_FILE=/etc/apt/sources.list.d/ferrotron-backports.sources

# apt-get install, non-interactive and quiet: apt_install [-t SUITE] PKG...
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"
}
