#!/usr/bin/env bash
# The demo and the exchange bench on the device machine (an NVIDIA H200; see
# docs/PERFORMANCE.md). Expects in .dev/ a stripped release `lockstep` and the three plugins,
# and in .gl/ the Vulkan loader packages (as scripts/h200.sh). Writes logs to $OUT.
set -uo pipefail
out=${OUT:-$PWD/h200-out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LOCKSTEP_PLUGIN_DIR=$PWD/.dev
bin=$PWD/.dev/lockstep
steps=${STEPS:-100}
{
  echo "### demo --headless, default model, $steps steps (cpu, lut, dp4a where admitted)"
  start=$SECONDS
  "$bin" demo --headless --no-data --steps "$steps" > "$out/demo.jsonl" 2> "$out/demo.err"
  echo "exit $? after $((SECONDS - start)) s"
  grep -E '"(log|peer-info|swapped|run-finished|guard-stopped)"' "$out/demo.jsonl" | sort -u | head -20
  echo "### replay of the group on the CPU alone (same ids, same data streams)"
  "$bin" train --backend cpu --steps "$steps" --replay-group 1,2,3 > "$out/replay.jsonl"
  echo "exit $?"
  echo "### bench exchange"
  "$bin" bench exchange --mb 64
} 2>&1 | tee "$out/demo.log"
