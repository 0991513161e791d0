#!/usr/bin/env bash
# A second Vulkan driver for the `tc` backend's tests: Mesa's lavapipe from Debian
# trixie-backports (26.1 today), which reports int8 cooperative matrices (VK_KHR_cooperative_matrix,
# s8 × s8 → s32 at 8 × 8 × 8) where bookworm's Mesa 22.3 (the system's lavapipe, on which `tc`
# must be refused) reports none. It is built against trixie's C library, so it is unpacked —
# with that C library, its loader and SPIRV-Tools' `spirv-val` — into a directory of its own and
# only ever run under that directory's dynamic loader (`docs/TENSOR_CORES.md`); nothing in `/` changes.
#
#   scripts/vulkan-coopmat.sh            unpack into $LOCKSTEP_COOPMAT_ROOT (default
#                                        ~/.cache/lockstep/vulkan-coopmat) unless already there
set -euo pipefail
root=${LOCKSTEP_COOPMAT_ROOT:-$HOME/.cache/lockstep/vulkan-coopmat}
if [ -f "$root/ready" ]; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/archives/partial" "$work/cache"
cat >"$work/sources.list" <<'LIST'
deb http://deb.debian.org/debian trixie main
deb http://deb.debian.org/debian trixie-backports main
LIST
: >"$work/status"
apt_opts=(
  -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
  -o Dir::State::Lists="$work/lists" -o Dir::State::status="$work/status"
  -o Dir::Cache="$work/cache" -o Dir::Cache::archives="$work/archives"
  -o Debug::NoLocking=1 -o APT::Sandbox::User=root
)
echo "vulkan-coopmat: fetching Mesa from trixie-backports into $root"
apt-get "${apt_opts[@]}" -qq update
# An empty package status: every dependency down to the C library is fetched, since none of
# trixie's may come from this system.
apt-get "${apt_opts[@]}" -qq install --download-only -y --no-install-recommends \
  mesa-vulkan-drivers/trixie-backports libvulkan1 spirv-tools >/dev/null
rm -rf "$root.partial"
mkdir -p "$root.partial/fs"
for deb in "$work"/archives/*.deb; do
  dpkg-deb -x "$deb" "$root.partial/fs"
done
lib="$root/fs/usr/lib/x86_64-linux-gnu"
cat >"$root.partial/lvp.json" <<JSON
{
    "file_format_version": "1.0.1",
    "ICD": { "library_path": "$lib/libvulkan_lvp.so", "api_version": "1.4.0" }
}
JSON
mesa=$(dpkg-deb -f "$work"/archives/mesa-vulkan-drivers_*.deb Version)
rm -rf "$root"
mv "$root.partial" "$root"
echo "mesa-vulkan-drivers $mesa" >"$root/ready"
echo "vulkan-coopmat: Mesa $mesa ready in $root"
