set -uo pipefail
PARTS=gate,identity bash scripts/h200-step.sh
bin=$PWD/.devbin/lockstep
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
{
echo "### A/B 25.6M dp4a: new tiles vs forced 128x64"
for t in "" 8x4x16x16x2 ""; do
  env ${t:+LOCKSTEP_GPU_TILE=$t} timeout 150 $bin bench train --backend dp4a --measure-steps 5 --warmup-steps 1 --no-float --no-torch --width 512 --context 256 --layers 8 --heads 8 --batch 16 2>&1 | grep "units (dp4a)"
done
echo "### A/B default dp4a"
for t in "" 8x4x16x16x2; do
  env ${t:+LOCKSTEP_GPU_TILE=$t} timeout 100 $bin bench train --backend dp4a --measure-steps 20 --no-float --no-torch 2>&1 | grep "units (dp4a)"
done
} 2>&1 | tee $OUT/ab.log
