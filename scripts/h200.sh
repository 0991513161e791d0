#!/usr/bin/env bash
# The GPU evidence run on a real NVIDIA GPU (the device machine's H200; see docs/PERFORMANCE.md).
# Expects, in .dev/, stripped release builds made on the build machine:
#   lockstep, liblockstep_backend_{cpu,lut,dp4a}.so, and the `conformance` and `tiles` test
#   binaries (cargo test --release --no-run -p lockstep-backends --test conformance
#   -p lockstep-gpu --test tiles), and in .gl/ the Vulkan loader packages.
# Writes logs to $OUT (or ./h200-out). `scripts/h200.sh demo` runs only the last part (the demo,
# its CPU replay and the exchange bench), which needs only `lockstep` and the plugins.
set -uo pipefail
out=${OUT:-$PWD/h200-out}
mkdir -p "$out"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LOCKSTEP_PLUGIN_DIR=$PWD/.dev
bin=$PWD/.dev
step() { echo; echo "### $*"; }
if [ "${1:-all}" != demo ]; then
{
  step nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  step gates
  for b in cpu lut dp4a; do "$bin/lockstep" gate "$b"; echo "exit $?"; done
  step conformance suite; "$bin/conformance" --test-threads 1 2>&1 | grep -v XDG_RUNTIME
  step tile invariance; "$bin/tiles" --test-threads 1 2>&1 | grep -v XDG_RUNTIME
} 2>&1 | tee "$out/gate.log"
{
  step tile sweep, 4096^3 kernel '(TMxTNxWXxWYxKB)'
  sweep="8x4x16x16x1 8x4x16x16x2 8x4x16x16x4 8x8x16x16x1 8x8x16x16x2 8x8x16x16x3 4x8x16x16x2 4x4x16x16x2 16x4x16x16x2 8x8x16x8x2 8x4x8x16x2"
  for b in dp4a lut; do
    if [ $b = dp4a ]; then list=${DP4A_SWEEP-$sweep}; else list=${LUT_SWEEP-$sweep}; fi
    for t in $list; do
      echo "tile $t $b $(LOCKSTEP_GPU_TILE=$t "$bin/lockstep" bench gemm --backend $b --shapes 4096x4096x4096 --min-ms 100 | grep kernel)"
    done
  done
  step bench gemm
  shapes=1024x1024x1024,4096x4096x4096,2048x384x128,2048x128x384,384x128x2048,2048x512x128,2048x128x512,128x128x32,128x32x128
  for b in dp4a lut cpu; do "$bin/lockstep" bench gemm --backend $b --shapes $shapes --min-ms 300; done
} 2>&1 | tee "$out/bench.log"
{
  step 200-step training per backend
  # The GPU runs share the machine: both at once, after the CPU run.
  for b in cpu dp4a lut; do
    run_one() {
      timeout ${TRAIN_TIMEOUT:-400} "$bin/lockstep" train --backend $1 --steps 200 --json --eval-batches 0 > "$out/train_$1.jsonl"
      echo "$1 exit $? steps $(grep -c whash "$out/train_$1.jsonl") last $(tail -1 "$out/train_$1.jsonl")"
    }
    if [ $b = cpu ]; then run_one $b; else run_one $b & fi
  done
  wait
  for b in dp4a lut; do
    if diff <(grep -o '"whash":"[^"]*"' "$out/train_cpu.jsonl") <(grep -o '"whash":"[^"]*"' "$out/train_$b.jsonl") >/dev/null; then
      echo "$b: every step's weight hash equals cpu's"
    else
      echo "$b: weight hashes DIFFER from cpu's"
    fi
  done
} 2>&1 | tee "$out/train.log"
fi

steps=${STEPS:-100}
{
  echo "### demo --headless, default model, $steps steps (cpu, lut, dp4a where admitted)"
  start=$SECONDS
  "$bin/lockstep" demo --headless --steps "$steps" > "$out/demo.jsonl" 2> "$out/demo.err"
  echo "exit $? after $((SECONDS - start)) s"
  grep -E '"(log|peer-info|swapped|run-finished|guard-stopped)"' "$out/demo.jsonl" | sort -u | head -20
  echo "### replay of the group on the CPU alone (same ids, same data streams)"
  "$bin/lockstep" train --backend cpu --steps "$steps" --replay-group 1,2,3 > "$out/replay.jsonl"
  echo "exit $?"
  echo "### bench exchange"
  "$bin/lockstep" bench exchange --mb 64
} 2>&1 | tee "$out/demo.log"
