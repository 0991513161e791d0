set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin
bin=$PWD/.devbin/lockstep
{
for b in dp4a lut; do timeout 120 $bin gate $b 2>&1 | grep -v XDG_RUNTIME | tail -2; done
shapes=512x1536x4096,512x512x4096,512x2048x4096,2048x512x4096,512x256x4096,4096x1536x512,4096x512x512,4096x2048x512,4096x512x2048,4096x256x512,32768x256x64,32768x64x256
for t in 8x4x16x16x2 4x4x16x16x1 4x4x16x16x2 4x8x16x16x2 8x4x16x8x2 4x4x8x16x2 8x8x16x16x1; do
  echo "## dp4a tile $t"
  LOCKSTEP_GPU_TILE=$t timeout 100 $bin bench gemm --backend dp4a --shapes $shapes --min-ms 60 --no-reference 2>&1 | grep -v XDG_RUNTIME
done
for t in 4x8x16x16x2 4x4x16x16x1 4x4x16x16x2; do
  echo "## lut tile $t"
  LOCKSTEP_GPU_TILE=$t timeout 100 $bin bench gemm --backend lut --shapes 512x1536x4096,512x2048x4096,4096x1536x512,32768x256x64,32768x64x256 --min-ms 60 --no-reference 2>&1 | grep -v XDG_RUNTIME
done
echo "## 25.6M train dp4a (paged build)"
timeout 200 $bin bench train --backend dp4a --measure-steps 3 --warmup-steps 1 --breakdown --no-float --no-torch --width 512 --context 256 --layers 8 --heads 8 --batch 16 2>&1 | grep -v XDG_RUNTIME
} 2>&1 | tee $OUT/sweep.log
