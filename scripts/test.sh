#!/usr/bin/env bash
# The full test suite, from a fresh machine: installs what the tests need when it is missing,
# checks formatting and lints, builds every target (the plugins the tests load are cdylibs),
# then runs every test. CI runs exactly this (see .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v python3 >/dev/null || need_apt+=(python3)
# The inference kit is tested in a real browser through ChromeDriver.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v chromedriver >/dev/null || need_apt+=(chromium-driver)
# /data is tested against a real HTTP server with range support.
command -v nginx >/dev/null || need_apt+=(nginx-light)
command -v pgrep >/dev/null || need_apt+=(procps)
# One mesh test puts nodes in two network namespaces of its own (iproute2's `ip`, as root).
command -v ip >/dev/null || need_apt+=(iproute2)
# The fault campaign cuts links and loses packets with nftables rules on a bridge of namespaces.
command -v nft >/dev/null || need_apt+=(nftables)
# The console end-to-end test drives the real binary inside tmux.
command -v tmux >/dev/null || need_apt+=(tmux)
# The GPU plugins (lut, dp4a) run for real on Mesa's lavapipe, a Vulkan 1.3 CPU driver with
# the integer dot product; no GPU test is skipped.
ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need_apt+=(mesa-vulkan-drivers)
# The `tc` backend runs on a newer lavapipe with int8 cooperative matrices, unpacked beside the
# system (scripts/vulkan-coopmat.sh); the binary that runs there is a copy with its loader set.
command -v patchelf >/dev/null || need_apt+=(patchelf)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need_apt[@]}"
fi

# ... reading parquet files that pyarrow (a third-party writer) produced.
python3 -c "import pyarrow" 2>/dev/null || python3 -m pip install --quiet pyarrow
# The packaged training corpus (docs/DATA.md), built once from Debian documentation packages:
# the demo, `train` and the benches train on it; the tests that start nodes read it as users do.
scripts/corpus.sh
# Mesa 26's lavapipe (int8 cooperative matrices) for the `tc` backend's tests (docs/TENSOR_CORES.md).
scripts/vulkan-coopmat.sh

# Each phase says when it starts: where CI's time goes is read off its log.
phase() { echo "== $(date -u +%T) $*"; }
phase fmt
cargo fmt --all -- --check
phase clippy
cargo clippy --workspace --all-targets --locked -- -D warnings
phase build
cargo build --workspace --all-targets --locked
phase test
cargo test --workspace --locked --no-fail-fast
phase done
