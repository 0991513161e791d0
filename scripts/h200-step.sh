#!/usr/bin/env bash
# The whole-step-on-the-GPU evidence run on the device machine's H200 (docs/PERFORMANCE.md,
# "The training step on the GPU"; docs/TENSOR_CORES.md): the gate with every op for tc, lut and
# dp4a on the NVIDIA driver, the bit-identity runs (200 steps of the default model, 20 of the
# 25.6M configuration, 5 of the GPT-2-small-sized one: every step's weight hash of each GPU
# backend against cpu's), and `bench train` for the three configurations beside PyTorch (CPU on
# 16 threads; CUDA eager and torch.compile, each in f32 with TF32 off, TF32 and bf16 autocast).
#
# Expects, built on the build machine: .devbin/ with stripped `lockstep` and
# liblockstep_backend_{cpu,lut,dp4a,tc}.so; .gl/ with the Vulkan loader packages (the device
# README says how). Writes logs to $OUT (or ./h200-out). PARTS picks parts: gate,identity,bench,gpt2.
# LOCAL=1 dry-runs it here on lavapipe (no loaders unpacked); SMALL, BIG, GPT2 (model flags), STEPS
# ("default big gpt2"), MEASURE, MEASURE_BIG, GPU (the backends, "tc dp4a lut") and BENCH_FLAGS
# (e.g. --no-torch, --torch-modes eager-f32) shrink it.
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
parts=${PARTS:-gate,identity,bench,gpt2}
read -r -a big <<< "${BIG:---width 512 --context 256 --layers 8 --heads 8 --batch 16}"
read -r -a gpt2 <<< "${GPT2:---width 768 --context 512 --layers 12 --heads 12 --batch 8}"
read -r -a small <<< "${SMALL:-}"
read -r -a steps <<< "${STEPS:-200 20 5}"
read -r -a gpus <<< "${GPU:-tc dp4a lut}"
read -r -a bench_flags <<< "${BENCH_FLAGS:-}"
has() { [[ ",$parts," == *",$1,"* ]]; }

if has gate; then
  {
    echo "### gates (units battery, then every op of three training steps and Adam + hash)"
    for b in "${gpus[@]}"; do timeout 300 "$bin" gate "$b" -v 2>&1 | grep -v XDG_RUNTIME | tail -6; echo "exit $?"; done
  } 2>&1 | tee "$out/gate.log"
fi

if has identity; then
  {
    # name, steps, model flags...
    identity() {
      local name=$1 steps=$2
      shift 2
      for b in cpu "${gpus[@]}"; do
        local started=$SECONDS
        timeout 280 "$bin" train --backend $b --steps "$steps" --json --eval-batches 0 --audit-every 0 "$@" \
          > "$out/${name}_$b.jsonl" 2> "$out/${name}_$b.err"
        echo "$name $b: exit $? after $((SECONDS - started)) s, $(grep -c whash "$out/${name}_$b.jsonl") steps"
      done
      for b in "${gpus[@]}"; do
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
    has gpt2 && identity gpt2 "${steps[2]}" "${gpt2[@]}"
  } 2>&1 | tee "$out/identity.log"
fi

if has bench; then
  {
    # PyTorch (every mode) and the float reference once per configuration, beside the first GPU
    # backend (tc, the fastest admitted); the others without them.
    first=${gpus[0]}
    echo "### bench gemm: each GPU backend's kernel at the 25.6M products, beside its path's ceiling"
    for b in "${gpus[@]}"; do
      timeout 120 "$bin" bench gemm --backend "$b" --shapes 4096x512x512,4096x2048x512,4096x512x2048,512x512x4096 --min-ms 300 2>&1 | grep -v XDG_RUNTIME
    done
    echo "### bench train, default model"
    timeout 280 "$bin" bench train --backend "$first" --measure-steps "${MEASURE:-20}" --breakdown "${small[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    for b in "${gpus[@]:1}"; do
      timeout 200 "$bin" bench train --backend "$b" --measure-steps "${MEASURE:-20}" --no-torch --no-float "${small[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    done
    echo "### bench train, 25.6M"
    timeout 400 "$bin" bench train --backend "$first" --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --breakdown --no-float "${big[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    for b in "${gpus[@]:1}"; do
      timeout 200 "$bin" bench train --backend "$b" --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --no-torch --no-float "${big[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    done
  } 2>&1 | tee "$out/bench.log"
fi

if has gpt2; then
  {
    # GPT-2-small-sized (c = 768, 12 layers, 12 heads, t = 512): the first GPU backend with
    # every PyTorch mode and the CPU node, the second GPU backend beside it.
    echo "### bench train, GPT-2-small-sized"
    timeout 500 "$bin" bench train --backend "${gpus[0]}" --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --breakdown --no-float \
      "${gpt2[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    for b in "${gpus[@]:1:1}"; do
      timeout 300 "$bin" bench train --backend "$b" --measure-steps "${MEASURE_BIG:-5}" --warmup-steps 1 --no-torch --no-float "${gpt2[@]}" "${bench_flags[@]}" 2>&1 | grep -v XDG_RUNTIME
    done
  } 2>&1 | tee "$out/gpt2.log"
fi
