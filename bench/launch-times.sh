#!/usr/bin/env bash
# How fast dtrain-launch gets a job going and brings it back: 4 workers of
# lm-small (examples/configs/lm-small.json) on this node.
#   launch_to_first_step_s  from starting dtrain-launch to rank 0's first training step
#   death_to_resumed_s      from SIGKILL of rank 1 (after step KILL_AT) to the first
#                           step of the restarted round, resumed from the last checkpoint
#   launch_to_workers_started_s, death_to_workers_restarted_s: the launcher's own
#                           share (until it has started the workers of round 0, of round 1)
# Every line of the launcher's output is timestamped as it arrives. Rank 0's
# progress lines read "[rank 0] [<ISO time> ]step N/STEPS | ..." (the time
# unless train.log_timestamps=false).
#
#   bench/launch-times.sh [BUILD_DIR]        (default: build)
#   STEPS=20 KILL_AT=7 NPROC=4 bench/launch-times.sh
#   CONFIG=job.json WORKER_ARGS="--set train.micro_batch_size=2" bench/launch-times.sh
# KILL_AT must be at least 5 (a checkpoint every 5 steps) for the restarted
# round to resume rather than start over.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
source "$repo/bench/lib.sh"
build=${1:-$repo/build}
steps=${STEPS:-20}
kill_at=${KILL_AT:-7}
nproc=${NPROC:-4}
config=${CONFIG:-$repo/examples/configs/lm-small.json}
read -r -a worker_args <<<"${WORKER_ARGS:-}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ts="$work/launch.ts"

command=("$build/bin/dtrain-launch" --standalone --nproc-per-node "$nproc" --max-restarts 1 --stop-timeout 5
         --log-dir "$work/logs" --
         "$build/bin/dtrain-worker" --config "$config"
         --set "train.out_dir=$work/run" --set "train.steps=$steps" --set train.log_every=1
         --set checkpoint.every_steps=5 --set checkpoint.resume=auto "${worker_args[@]}")
start=$EPOCHREALTIME
"${command[@]}" > >(while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done > "$ts") 2>&1 &
launcher=$!

# Waits (up to 600 s) for a line matching $1 in the timestamped output. A
# worker that fails before (a config error, a crash) stops the benchmark at
# once, with its error.
wait_for() {
  for _ in $(seq 6000); do
    grep -qE "$1" "$ts" 2>/dev/null && return 0
    if grep -qE 'dtrain-launch: rank [0-9]+ failed' "$ts" 2>/dev/null || ! kill -0 "$launcher" 2>/dev/null; then
      kill "$launcher" 2>/dev/null || true
      wait "$launcher" || true
      sleep 0.2  # the last lines through the timestamping loop
      bench_failed "the job (before '$1')" "$(cat "$ts")"
    fi
    sleep 0.1
  done
  bench_failed "waiting 600 s for a line matching '$1'" "$(cat "$ts")"
}

# Rank 0's progress line of step $1 (any step: '[0-9]+').
progress() { printf '\\[rank 0\\] ([^ ]+ )?step +%s/' "$1"; }

wait_for "$(progress "$kill_at")"
victim=$(sed -nE 's/.*round 0: rank 1 is pid ([0-9]+).*/\1/p' "$ts")
killed=$EPOCHREALTIME
kill -9 "$victim"
wait "$launcher" || true
sleep 0.2  # the last lines through the timestamping loop

first_step=$(grep -m1 -E "$(progress 1)" "$ts" | cut -d' ' -f1)
any_step=$(progress '[0-9]+')
resumed=$(awk -v p="$any_step" '/dtrain-launch: round 1:/ {r = 1} r && $0 ~ p {print $1; exit}' "$ts")
resumed_step=$(awk -v p="$any_step" '/dtrain-launch: round 1:/ {r = 1}
  r && $0 ~ p {for (i = 1; i < NF; i++) if ($i == "step" && $(i + 1) ~ /^[0-9]+\//) {
    split($(i + 1), s, "/"); print s[1]; exit}}' "$ts")
[[ -n $first_step && -n $resumed && -n $resumed_step ]] ||
  bench_failed "finding rank 0's first step and the restarted round's first step" "$(cat "$ts")"
# The launcher's own share: until its workers of round 0 (and of round 1) were started.
spawned=$(grep -m1 -E 'round 0: rank [0-9]+ is pid' "$ts" | cut -d' ' -f1)
respawned=$(grep -m1 -E 'round 1: rank [0-9]+ is pid' "$ts" | cut -d' ' -f1)
grep -q "all workers of every node finished" "$ts" || bench_failed "the restarted job" "$(cat "$ts")"

echo "dtrain-launch, $nproc workers of $(basename "$config" .json), $(nproc) cores; rank 1 killed after step $kill_at, resumed at step $resumed_step"
echo "command: ${command[*]}"
awk -v a="$start" -v b="$first_step" 'BEGIN {printf "launch_to_first_step_s: %.2f\n", b - a}'
awk -v a="$killed" -v b="$resumed" 'BEGIN {printf "death_to_resumed_s: %.2f\n", b - a}'
awk -v a="$start" -v b="$spawned" 'BEGIN {printf "launch_to_workers_started_s: %.2f\n", b - a}'
awk -v a="$killed" -v b="$respawned" 'BEGIN {printf "death_to_workers_restarted_s: %.2f\n", b - a}'
