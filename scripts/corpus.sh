#!/usr/bin/env bash
# Builds the packaged training corpus (docs/DATA.md) once: downloads four Debian documentation
# packages (python3.11-doc, debian-handbook, linux-doc-6.1, perl-doc; not installed, only
# unpacked into a temporary directory), keeps their running English prose and writes it as
# FineWeb-Edu-shaped parquet to $LOCKSTEP_CORPUS (default ~/.cache/lockstep/corpus).
# Does nothing when the corpus is already there; --force builds it again.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${LOCKSTEP_CORPUS:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/corpus}
if [ -f "$out/manifest.json" ] && [ "${1:-}" != "--force" ]; then
  echo "corpus: already built in $out"
  exit 0
fi
python3 -c "import pyarrow" 2>/dev/null || python3 -m pip install --quiet pyarrow
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
packages=(python3.11-doc debian-handbook linux-doc-6.1 perl-doc)
echo "corpus: downloading ${packages[*]}"
# `apt-get download` writes into the current directory; the package lists may need a refresh
# on a fresh machine. _apt cannot write into a root-owned mktemp directory: allow it.
chmod 755 "$work"
if ! (cd "$work" && apt-get download -qq "${packages[@]}" 2>/dev/null); then
  apt-get update -qq
  (cd "$work" && apt-get download -qq "${packages[@]}")
fi
for deb in "$work"/*.deb; do dpkg -x "$deb" "$work/root"; done
mkdir -p "$out.partial"
python3 scripts/corpus.py "$work/root" "$out.partial"
rm -rf "$out"
mv "$out.partial" "$out"
echo "corpus: built in $out"
