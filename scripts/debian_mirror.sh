#!/usr/bin/env bash
# Prints the first Debian archive mirror (a URI whose path ends in /debian) that apt uses, read from
# the one-line sources (`deb [opts] URI suite comps` in *.list files) and the deb822 sources
# (`URIs: URI ...` in *.sources files). Commented-out lines and disabled files are skipped; prints
# nothing when none is found. Sourced by scripts/docker_check.sh; tested by
# tests/scripts/test_debian_mirror.py.
#
#   scripts/debian_mirror.sh [APT_DIR]     # APT_DIR defaults to /etc/apt
set -uo pipefail
apt_dir=${1:-/etc/apt}
files=()
[[ -f $apt_dir/sources.list ]] && files+=("$apt_dir/sources.list")
for f in "$apt_dir"/sources.list.d/*.list "$apt_dir"/sources.list.d/*.sources; do
  [[ -f $f ]] && files+=("$f")
done
((${#files[@]})) || exit 0
awk '
  { sub(/#.*/, "") }                                             # comments, whole-line or trailing
  FILENAME ~ /\.sources$/ && tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i; next }
  FILENAME !~ /\.sources$/ && $1 == "deb" {
    i = 2
    if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }   # skip [arch=... signed-by=...]
    if (i <= NF) print $i
  }
' "${files[@]}" | grep -E '^https?://[^ ]+/debian/?$' | head -1
exit 0
