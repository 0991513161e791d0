#!/usr/bin/env bash
# One-process replays of a group (`lockstep train --replay-group`) over a grid of settings, run
# side by side on the device machine's 16 host cores (docs/PERFORMANCE.md, "Every-step sparse
# sync"). The CPU mirror gives the same bits on any machine, so a replay's held-out loss here is
# the build machine's, only sooner.
#
# Expects .devbin/ with the stripped `lockstep`, liblockstep_backend_cpu.so and the packaged
# corpus in .devbin/corpus. GRID: one run a line, `NAME FLAGS…` (train's flags past the common
# ones); JOBS runs at once (default 16), THREADS a run (default 1), STEPS (default 300),
# MEMBERS (default 1,2,3,4). Writes $OUT/replays.jsonl: {"name", "flags", "heldout_loss",
# "seconds"} a run.
set -uo pipefail
out=${OUT:-$PWD/replays-out}
mkdir -p "$out"
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin LOCKSTEP_CORPUS=$PWD/.devbin/corpus
bin=${BIN:-$PWD/.devbin/lockstep}
one() {
  local name=$1
  shift
  local started=$SECONDS
  local last
  last=$("$bin" train --backend cpu --threads "${THREADS:-1}" --steps "${STEPS:-300}" \
    --replay-group "${MEMBERS:-1,2,3,4}" --eval-batches 8 "$@" 2> "$out/$name.err" | tail -1)
  local loss
  loss=$(printf '%s' "$last" | sed -n 's/.*"heldout_loss":\([^,}]*\).*/\1/p')
  printf '{"name":"%s","flags":"%s","heldout_loss":%s,"seconds":%d}\n' "$name" "$*" "${loss:-null}" \
    $((SECONDS - started)) >> "$out/replays.jsonl"
  [[ -s "$out/$name.err" ]] || rm -f "$out/$name.err"
}
export -f one
export out bin
printf '%s\n' "$GRID" | grep -v '^ *$' | xargs -P "${JOBS:-16}" -I{} bash -c 'one {}'
sort "$out/replays.jsonl"
