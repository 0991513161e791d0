#!/usr/bin/env bash
# The whole-step-on-the-GPU evidence run on the device machine's H200 (docs/PERFORMANCE.md,
# "The training step on the GPU"): the gate with every op for lut and dp4a on the NVIDIA driver,
# the bit-identity runs (200 steps of the default model and 20 steps of the 25.6M configuration:
# every step's weight hash of lut and dp4a against cpu's), and `bench train` for both
# configurations beside PyTorch (CPU on 16 threads, CUDA eager with TF32 off, torch.compile).
#
# Expects, built on the build machine: .devbin/ with stripped `lockstep` and
# liblockstep_backend_{cpu,lut,dp4a}.so; .gl/ with the Vulkan loader packages (the device
# README says how). Writes logs to $OUT (or ./h200-out). PARTS picks parts: gate,identity,bench.
# LOCAL=1 dry-runs it here on lavapipe (no loaders unpacked); SMALL, BIG (model flags), STEPS
# ("default big"), MEASURE, MEASURE_BIG and BENCH_FLAGS (e.g. --no-torch) shrink it.
set -uo pipefail
out=${OUT:-$PWD/h200-out}
mkdir -p "$out"
if [ -z "${LOCAL:-}" ]; then
  for f in .gl/*.deb; do dpkg -x "$f" /; done
  ldconfig
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin
bin=$PWD/.devbin/lockstep
parts=${PARTS:-gate,identity,bench}
read -r -a big <<< "${BIG:---width 512 --context 256 --layers 8 --heads 8 --batch 16}"
read -r -a small <<< "${SMALL:-}"
read -r -a steps <<< "${STEPS:-200 20}"
read -r -a bench_flags <<< "${BENCH_FLAGS:-}"
has() { [[ ",$parts," == *",$1,"* ]]; }

if has gate; then
  {
    echo "### gates (units battery, then every op of three training steps and Adam + hash)"
    for b in lut dp4a; do timeout 300 "$bin" gate "$b" -v 2>&1 | grep -v XDG_RUNTIME | tail -6; echo "exit $?"; done
  } 2>&1 | tee "$out/gate.log"
fi

if has identity; then
  {
    # name, steps, model flags...
    identity() {
      local name=$1 steps=$2
      shift 2
      for b in cpu dp4a lut; do
        local started=$SECONDS
        timeout 280 "$bin" train --backend $b --steps "$steps" --json --eval-batches 0 --audit-every 0 "$@" \
          > "$out/${name}_$b.jsonl" 2> "$out/${name}_$b.err"
        echo "$name $b: exit $? after $((SECONDS - started)) s, $(grep -c whash "$out/${name}_$b.jsonl") steps"
      done
      for b in dp4a lut; do
        if cmp -s <(grep -o '"whash":"[^"]*"' "$out/${name}_cpu.jsonl") <(grep -o '"whash":"[^"]*"' "$out/${name}_$b.jsonl") \
          && [ "$(grep -c whash "$out/${name}_$b.jsonl")" = "$steps" ]; then
          echo "$name $b: every one of $steps steps has cpu's weight hash (last $(grep -o '"whash":"[^"]*"' "$out/${name}_$b.jsonl" | tail -1))"
        else
          echo "$name $b: weight hashes DIFFER from cpu's (or the run did not finish)"
        fi
      done
    }
    echo "### bit identity"
    identity default "${steps[0]}" "${small[@]}"
    identity big "${steps[1]}" "${big[@]}"
  } 2>&1 | tee "$out/identity.log"
fi

if has bench; then
  {
    # PyTorch and the float reference once per configuration, beside dp4a; lut without them.
    echo "### bench train, default model"
    timeout 280 "$bin" bench train --backend dp4a --measure-steps "${MEASURE:-20}" --breakdown "${small[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    timeout 200 "$bin" bench train --backend lut --measure-steps "${MEASURE:-20}" --no-torch --no-float "${small[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    echo "### bench train, 25.6M"
    timeout 280 "$bin" bench train --backend dp4a --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --breakdown --no-float "${big[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    timeout 200 "$bin" bench train --backend lut --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --no-torch --no-float "${big[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
  } 2>&1 | tee "$out/bench.log"
fi
