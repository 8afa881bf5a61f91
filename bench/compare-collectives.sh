#!/usr/bin/env bash
# dtrain's CPU collectives against the libraries they wrap, in one run, on
# two ranks under mpirun (loopback only):
# 1. fp32 sum allreduce at 16 MiB and 64 MiB, for mpi and gloo: the raw
#    library (dtrain-bench-raw: MPI_Allreduce / gloo::allreduce called
#    directly) and `dtrain-bench allreduce`, interleaved raw, dtrain, raw,
#    dtrain, ... for ROUNDS rounds. Each run's busbw is the mean of 20
#    operations; the table reports the MEDIAN of the rounds and the ratio
#    dtrain/raw, then `mpi_16M_ratio: 0.98`-style lines.
# 2. a correctness sweep: every collective x every dtype (f32, bf16, f16) on
#    mpi and gloo, 8 B .. 64 MiB, summing #wrong into `wrong_total: N`.
#
#   bench/compare-collectives.sh
#   ROUNDS=5 SWEEP_ITERS=10 BUILD_DIR=build JOBS=4 bench/compare-collectives.sh
#   ROUNDS=1 SWEEP_ITERS=1 SWEEP_MAX_BYTES=64K SKIP_BUILD=1 bench/compare-collectives.sh   (a smoke test)
#
# The first line printed is the command that reproduces the output. Exits 1
# when any result was wrong, and at the first run that fails (with its error).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"
build=${BUILD_DIR:-$repo/build}
rounds=${ROUNDS:-3}
sweep_iters=${SWEEP_ITERS:-5}
sweep_max=${SWEEP_MAX_BYTES:-64M}
echo "# command: ROUNDS=$rounds SWEEP_ITERS=$sweep_iters SWEEP_MAX_BYTES=$sweep_max BUILD_DIR=$build" \
  "bench/compare-collectives.sh"

# Builds the two programs first (incremental; it says so, and the build's
# output goes to stderr). SKIP_BUILD=1 takes the binaries as they are.
if [[ ${SKIP_BUILD:-0} != 1 ]]; then
  echo "compare-collectives.sh: building dtrain-bench and dtrain-bench-raw in $build first" \
    "(SKIP_BUILD=1 uses them as they are)" >&2
  [[ -f $build/CMakeCache.txt ]] || cmake -S "$repo" -B "$build" -G Ninja >&2
  cmake --build "$build" --target dtrain-bench dtrain-bench-raw -j "${JOBS:-2}" >&2
fi
for program in "$build/bin/dtrain-bench" "$build/bin/dtrain-bench-raw"; do
  [[ -x $program ]] || { echo "compare-collectives.sh: $program is missing: build it" \
    "(cmake --build $build --target $(basename "$program")) or leave SKIP_BUILD unset" >&2; exit 1; }
done
bench=$build/bin/dtrain-bench
raw=$build/bin/dtrain-bench-raw

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
mpirun=(mpirun -np 2)

# A loopback port that was free a moment ago, for the store rank 0 hosts.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' 2>/dev/null || echo $((20000 + RANDOM % 20000))
}

# busbw SIZE TEXT: the busbw column of the table row for SIZE bytes.
busbw() { awk -v s="$1" '$1 == s { print $7; exit }' <<<"$2"; }
# field NAME TEXT: the value of the `NAME: value` line.
field() { awk -v k="$1:" '$1 == k { print $2; exit }' <<<"$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# run_raw LIB ARGS...: the baseline; gloo meets through a fresh FileStore dir.
run_raw() {
  local lib=$1; shift
  if [[ $lib == gloo ]]; then
    local dir; dir=$(mktemp -d)
    "${mpirun[@]}" "$raw" gloo allreduce "$@" --store-dir "$dir"
    rm -rf "$dir"
  else
    "${mpirun[@]}" "$raw" mpi allreduce "$@"
  fi
}

# run_dtrain BACKEND COLLECTIVE ARGS...: dtrain-bench; gloo meets through the
# store rank 0 hosts at DTRAIN_STORE.
run_dtrain() {
  local backend=$1 collective=$2; shift 2
  if [[ $backend == gloo ]]; then
    DTRAIN_STORE=127.0.0.1:$(free_port) "${mpirun[@]}" -x DTRAIN_STORE \
      "$bench" "$collective" --backend gloo "$@"
  else
    "${mpirun[@]}" "$bench" "$collective" --backend mpi "$@"
  fi
}

# ---- 1. raw library vs dtrain, allreduce fp32 sum ---------------------------
sizes=(16777216 67108864)
declare -A name=([16777216]=16M [67108864]=64M)
declare -A results  # "<backend> <size> raw|dtrain" -> busbw of every round
range=(--min-bytes 16M --max-bytes 64M --step-factor 4)
for backend in mpi gloo; do
  for ((r = 1; r <= rounds; r++)); do
    for side in raw dtrain; do
      if [[ $side == raw ]]; then out=$(run_raw "$backend" "${range[@]}")
      else out=$(run_dtrain "$backend" allreduce "${range[@]}"); fi
      line="# round $r $backend $side:"
      for s in "${sizes[@]}"; do
        bw=$(busbw "$s" "$out")
        results["$backend $s $side"]+="${bw:-0} "
        line+=" ${name[$s]} busbw ${bw:-n/a}"
      done
      line+=" page_faults/op $(field page_faults_per_op_max "$out")"
      echo "$line"
    done
  done
done

echo
printf '%-8s %-6s %16s %19s %11s\n' backend size "raw_busbw(GB/s)" "dtrain_busbw(GB/s)" dtrain/raw
ratios=()
for backend in mpi gloo; do
  for s in "${sizes[@]}"; do
    # shellcheck disable=SC2086  # the rounds' values, split on spaces
    raw_bw=$(median ${results["$backend $s raw"]})
    # shellcheck disable=SC2086
    dtrain_bw=$(median ${results["$backend $s dtrain"]})
    ratio=$(awk -v a="$dtrain_bw" -v b="$raw_bw" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
    printf '%-8s %-6s %16.3f %19.3f %11s\n' "$backend" "${name[$s]}" "$raw_bw" "$dtrain_bw" "$ratio"
    ratios+=("${backend}_${name[$s]}_ratio: $ratio")
  done
done
echo "# busbw: median of $rounds interleaved rounds; each round the mean of 20 allreduces"
printf '%s\n' "${ratios[@]}"

# ---- 2. correctness sweep ---------------------------------------------------
echo
printf '%-8s %-15s %-6s %14s %15s %8s\n' backend collective dtype "busbw_64M(GB/s)" \
  "busbw_avg(GB/s)" "#wrong"
wrong_total=0
for backend in mpi gloo; do
  for collective in allreduce reduce_scatter allgather broadcast; do
    for dtype in f32 bf16 f16; do
      out=$(run_dtrain "$backend" "$collective" --dtype "$dtype" --min-bytes 8 --max-bytes "$sweep_max" \
              --iters "$sweep_iters" --warmup 1 2>&1) || bench_failed "$backend $collective $dtype" "$out"
      wrong=$(field wrong_total "$out")
      [[ -n $wrong ]] || bench_failed "$backend $collective $dtype (no wrong_total line)" "$out"
      wrong_total=$((wrong_total + wrong))
      printf '%-8s %-15s %-6s %14s %15s %8s\n' "$backend" "$collective" "$dtype" \
        "$(busbw 67108864 "$out")" "$(field busbw_avg "$out")" "$wrong"
    done
  done
done
echo "# sweep: 2 ranks, 8 B .. $sweep_max doubling, $sweep_iters timed operations per size, op sum"
echo "wrong_total: $wrong_total"
[[ $wrong_total -eq 0 ]]
