#!/usr/bin/env bash
# `lockstep bench audit` on the device machine's 16 host cores (docs/TRUST.md): four members on
# loopback, each training on its own thread(s) and auditing on a worker of its own at the lowest
# priority — members with cores of their own, which the build machine's two cores are not.
#
# Expects, built on the build machine: .devbin/ with the stripped `lockstep`,
# liblockstep_backend_cpu.so, libflaw_rare_flip.so and libflaw_after_warmup.so, and the packaged
# corpus in .devbin/corpus. Writes one JSON line per part to $OUT (or ./audit-out).
# PARTS picks parts (f32,int8,int8-whole,outer,plugins,plugins1 (at rate 1): int8-whole is int8 with routine audits
# asking for the whole residual); RUNS, PAIRS, RATE, THREADS, HONEST_STEPS shrink it; KEEP=1
# keeps every rogue run's reports under $OUT/keep-PART (`bench audit --keep`).
set -uo pipefail
out=${OUT:-$PWD/audit-out}
mkdir -p "$out"
export LOCKSTEP_PLUGIN_DIR=$PWD/.devbin LOCKSTEP_CORPUS=$PWD/.devbin/corpus
bin=$PWD/.devbin/lockstep
parts=${PARTS:-f32,int8,outer,plugins}
common=(--runs "${RUNS:-10}" --threads "${THREADS:-1}" --json)
has() { [[ ",$parts," == *",$1,"* ]]; }
part() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  local keep=()
  [[ -n "${KEEP:-}" ]] && keep=(--keep "$out/keep-$name")
  timeout "$limit" "$bin" bench audit "${common[@]}" "${keep[@]}" --rate "${rate:-${RATE:-0.6}}" --pairs "${pairs:-${PAIRS:-3}}" "$@" \
    > "$out/$name.json" 2> "$out/$name.err"
  echo "$name: exit $? after $((SECONDS - started)) s"
}

nproc
has f32 && part f32 240 --honest-steps "${HONEST_STEPS:-200}"
has int8 && part int8 300 --compress int8 --kinds state,flip,scale:1.001,stale,batch --honest-steps "${HONEST_STEPS:-200}"
has outer && part outer 300 --compress int8 --sync outer:2 --kinds state,flip,scale:1.001,stale,batch \
  --honest-steps "${HONEST_STEPS:-100}"
plugins=(--kinds "plugin:$PWD/.devbin/libflaw_rare_flip.so,plugin:$PWD/.devbin/libflaw_after_warmup.so"
  --honest-steps 20 --within-s 40)
has plugins && pairs=1 part plugins 300 "${plugins[@]}"
# The same at every contribution audited once a step.
has plugins1 && rate=1 pairs=1 part plugins1 300 "${plugins[@]}"
has int8-whole && part int8-whole 300 --compress int8 --kinds state,flip,scale:1.001,stale,batch \
  --honest-steps "${HONEST_STEPS:-200}" --state-part 1
