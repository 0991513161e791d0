#!/usr/bin/env bash
# `lockstep bench audit` on the device machine's 16 host cores (docs/TRUST.md): four members on
# loopback, each training on its own thread(s) and auditing on a worker of its own at the lowest
# priority — members with cores of their own, which the build machine's two cores are not.
#
# Expects, built on the build machine: .devbin/ with the stripped `lockstep`,
# liblockstep_backend_cpu.so, libflaw_rare_flip.so and libflaw_after_warmup.so, and the packaged
# corpus in .devbin/corpus. Writes one JSON line per part to $OUT (or ./audit-out).
# PARTS picks parts (f32,int8,int8-whole,outer,outer-f32,outer-overlap,outer-default,plugins,plugins1 (at rate 1),
# weights-f32,weights-int8,weights-outer (the guard's disputes: one weight's bit flipped once, in each mode)):
# int8-whole is int8 with routine audits asking for the whole residual; outer-f32 and outer-overlap are
# `outer:2` f32 and `outer:2` int8 overlapped by one step; outer-default is `outer:2` int8 at the default
# model, 128,128,4,4,16, on two threads a member, as int8-default is every-step int8); RUNS, PAIRS, RATE, THREADS, HONEST_STEPS shrink it; KEEP=1
# keeps every rogue run's reports under $OUT/keep-PART (`bench audit --keep`); BIN runs another build
# (a before/after pair in one call). The tiny model's honest runs are 1,000 syncs: runs of 100 (under a
# second at 150-300 syncs/s) put their pairs' shares 50 points apart on this machine.
set -uo pipefail
out=${OUT:-$PWD/audit-out}
mkdir -p "$out"
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin LOCKSTEP_CORPUS=$PWD/.devbin/corpus
bin=${BIN:-$PWD/.devbin/lockstep}
parts=${PARTS:-f32,int8,outer,plugins}
common=(--runs "${RUNS:-10}" --json ${AUDIT_WORKERS:+--audit-workers "$AUDIT_WORKERS"}
  ${AUDIT_THREADS:+--audit-threads "$AUDIT_THREADS"} ${HONEST_BACKENDS:+--honest-backends "$HONEST_BACKENDS"})
# HONEST_BACKENDS (e.g. cpu,lut,dp4a,cpu) puts the honest members on those backends, the WGSL ones on
# the GPU's Vulkan driver: the loader must be installed first (.gl, the device README).
# AUDIT_WORKERS and AUDIT_THREADS set every member's --audit-workers (by default the node's choice:
# 2 on 16 cores) and --audit-threads (by default every core) and tag the output files
# (PART-RATE-wN-tM.json).
tag=${AUDIT_WORKERS:+-w$AUDIT_WORKERS}${AUDIT_THREADS:+-t$AUDIT_THREADS}${HONEST_BACKENDS:+-mixed}
has() { [[ ",$parts," == *",$1,"* ]]; }
part() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  local keep=()
  [[ -n "${KEEP:-}" ]] && keep=(--keep "$out/keep-$name")
  timeout "$limit" "$bin" bench audit "${common[@]}" "${keep[@]}" --threads "${threads:-${THREADS:-1}}" --rate "${rate:-${RATE:-0.6}}" --pairs "${pairs:-${PAIRS:-3}}" "$@" \
    > "$out/$name-${rate:-${RATE:-0.6}}$tag.json" 2> "$out/$name-${rate:-${RATE:-0.6}}$tag.err"
  echo "$name: exit $? after $((SECONDS - started)) s"
}

nproc
has f32 && part f32 420 --honest-steps "${HONEST_STEPS:-1000}"
has int8 && part int8 420 --compress int8 --kinds state,flip,scale:1.001,stale,batch --honest-steps "${HONEST_STEPS:-1000}"
has outer && part outer 420 --compress int8 --sync outer:2 --kinds state,flip,scale:1.001,stale,batch \
  --honest-steps "${HONEST_STEPS:-1000}"
has outer-f32 && part outer-f32 420 --sync outer:2 --kinds state,flip,scale:1.001,stale,batch \
  --honest-steps "${HONEST_STEPS:-1000}"
has outer-overlap && part outer-overlap 420 --compress int8 --sync outer:2 --overlap 1 \
  --kinds state,flip,scale:1.001,stale,batch --honest-steps "${HONEST_STEPS:-1000}"
has outer-default && threads=2 part outer-default 400 --compress int8 --sync outer:2 --model 128,128,4,4,16 \
  --kinds state,flip,scale:1.001,stale,batch --honest-steps "${HONEST_STEPS:-40}"
has int8-default && threads=2 part int8-default 400 --compress int8 --model 128,128,4,4,16 \
  --kinds state,flip,scale:1.001,stale,batch --honest-steps "${HONEST_STEPS:-60}"
# The guard's disputes (docs/TRUST.md): a member's weights with one bit flipped, named to the word.
has weights-f32 && part weights-f32 300 --kinds weights --honest-steps "${HONEST_STEPS:-200}"
has weights-int8 && part weights-int8 300 --compress int8 --kinds weights --honest-steps "${HONEST_STEPS:-200}"
has weights-outer && part weights-outer 300 --compress int8 --sync outer:2 --kinds weights \
  --honest-steps "${HONEST_STEPS:-200}"
plugins=(--kinds "plugin:$PWD/.devbin/libflaw_rare_flip.so,plugin:$PWD/.devbin/libflaw_after_warmup.so"
  --honest-steps 20 --within-s 40)
has plugins && pairs=1 part plugins 300 "${plugins[@]}"
# The same at every contribution audited once a step.
has plugins1 && rate=1 pairs=1 part plugins1 300 "${plugins[@]}"
has int8-whole && part int8-whole 420 --compress int8 --kinds state,flip,scale:1.001,stale,batch \
  --honest-steps "${HONEST_STEPS:-1000}" --state-part 1
