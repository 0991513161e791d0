set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
bin=$PWD/.devbin/lockstep
{
timeout 120 $bin gate dp4a 2>&1 | tail -1
timeout 200 $bin bench train --backend dp4a --measure-steps 5 --warmup-steps 1 --breakdown --no-float --width 512 --context 256 --layers 8 --heads 8 --batch 16 2>&1 | grep -v XDG_RUNTIME
timeout 100 $bin bench train --backend dp4a --measure-steps 20 --no-float --no-torch 2>&1 | grep "units (dp4a)"
} 2>&1 | tee $OUT/q.log
