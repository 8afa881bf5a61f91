#!/usr/bin/env bash
# dtrain's data-parallel training against PyTorch's, in one run, on this
# machine's two cores, for lm-small and cls-seed (examples/configs), one
# thread per process. Every PyTorch peer in PEERS (default "debian pypi
# pypi-compile": Debian's python3-torch 1.13, PyPI's torch 2.x eager, and the
# same with torch.compile; bench/compare-pytorch.sh says more) gives two rows,
# named after its version (torch-1.13.0a0-1, torch-2.15.0-compile-ddp, ...):
#   PEER-1      bench/pytorch_train.py: one process, its fastest variant (sweep)
#   PEER-ddp    bench/pytorch_ddp.py: DistributedDataParallel, 2 ranks, gloo over
#               loopback, the fastest of a staged sweep: the single process's
#               two fastest variants, then bucket_cap_mb {1,25,100} x
#               gradient_as_bucket_view {0,1} on the faster one; with
#               torch.compile (every setting compiles anew) only the setting
#               the eager pypi peer found fastest (25 MB, as_view 0 without it)
#   dtrain-1    dtrain-bench train, one process
#   BACKEND-stageN  dtrain-bench train under `mpirun -np 2`, ZeRO stage N, backend
#               gloo (the store on 127.0.0.1) or mpi; DTRAIN_SET adds --set
#               overrides to every dtrain run (e.g. "parallel.bucket_mb=4")
# A peer that fails or runs past PEER_TIMEOUT_S is a row that says why;
# dtrain's failures stop the script.
# tokens/s count all ranks and come from the mean step on every side. The
# table gives each run's ratio to the fastest PEER-ddp (named below the
# table), its scaling efficiency (2-rank
# tokens/s / (2 x the same side's 1-process tokens/s)) and the share of
# gradient communication dtrain hid behind backward; `name: value` lines follow.
# REPEATS=N (default 1) takes every figure N times, interleaved in rounds (per
# config: each peer's two runs, then dtrain-1 and every BACKEND-stageN; again
# N times), so the machine's drift reaches every side alike. The sweeps run in
# round 1 only: rounds 2..N rerun each peer's single process at the variant
# its round 1 chose, and its DDP run at the setting its round 1 chose
# (variant, bucket_cap_mb, gradient_as_bucket_view, all in that run's output),
# so every row is repeated. The table and the `name: value` lines then give
# medians over the rounds (tokens/s, comm_ms, hidden share, ...), and ratios
# and scaling efficiencies of those medians; each round's tokens/s is printed
# as it finishes and again above the table. A peer run that fails in any round
# is not repeated, and its row says why it first failed.
#
#   bench/compare-ddp.sh                       # both configs, ~30-40 minutes
#   STEPS=10 STAGES="0 3" BACKENDS=gloo PEERS=debian bench/compare-ddp.sh lm-small
#   REPEATS=3 STAGES=0 BACKENDS=gloo PEERS=debian bench/compare-ddp.sh lm-small
#
# The first line printed is the command that reproduces the output; every
# run's full output is kept in LOG_DIR (a fresh temporary folder by default).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"   # bench_failed, median_outputs
build=${BUILD_DIR:-$repo/build}
repeats=${REPEATS:-1}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "compare-ddp: REPEATS must be 1 or more" >&2; exit 2; }
steps=${STEPS:-5}
warmup=${WARMUP:-2}
sweep_steps=${SWEEP_STEPS:-1}
stages=${STAGES:-0 1 2 3}
backends=${BACKENDS:-gloo mpi}
peers=${PEERS:-debian pypi pypi-compile}
peer_timeout=${PEER_TIMEOUT_S:-2700}
bind=${BIND:-none}   # mpirun --bind-to; none: scheduled like PyTorch's ranks
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(lm-small cls-seed)
log_dir=${LOG_DIR:-$(mktemp -d -t compare-ddp.XXXXXX)}
mkdir -p "$log_dir"
echo "# command: REPEATS=$repeats STEPS=$steps WARMUP=$warmup SWEEP_STEPS=$sweep_steps STAGES=\"$stages\"" \
  "BACKENDS=\"$backends\" BIND=$bind DTRAIN_SET=\"${DTRAIN_SET:-}\" PEERS=\"$peers\"" \
  "BUILD_DIR=$build" \
  "bench/compare-ddp.sh ${configs[*]}"
echo "# full outputs: $log_dir"

bench=$build/bin/dtrain-bench
[[ -x $bench ]] || { echo "compare-ddp: $bench is not built" >&2; exit 1; }
py=/usr/bin/python3   # Debian's python3-torch
# PyPI's torch, installed on first use; a failed install fails its peers only.
pypi_python="" pypi_error=""
if [[ " $peers " == *" pypi"* ]]; then
  pypi_python=$("$repo/scripts/setup-torch.sh") || pypi_error="scripts/setup-torch.sh failed"
fi

# One thread per process; OpenMP pools must not spin against each other.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun -np 2 --bind-to "$bind" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
dtrain_args=(--steps "$steps" --warmup "$warmup" --peak-seconds 0.5)
for s in ${DTRAIN_SET:-}; do dtrain_args+=(--set "$s"); done

free_port() {
  $py -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
# field NAME TEXT: the value of the `NAME: value` line in TEXT (empty if none).
field() { awk -v k="$1:" '$1 == k { print $2; exit }' <<<"$2"; }
# ratio A B: A / B to 2 decimals, n/a when either is missing.
ratio() {
  if [[ -n $1 && -n $2 ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
  else echo n/a; fi
}
# The sweep table of bench/pytorch_train.py, fastest step first: the two
# fastest variants, comma-separated (rows with a best_ms only: not the header,
# a failed row, or a `failed:` line after a cut-off sweep).
top_two_variants() {
  awk '/^# sweep:/ { on = 1; next } /^# fastest/ { on = 0 }
       on && $1 != "variant" && $2 != "failed" && $3 ~ /^[0-9.]+$/ { print $3, $1 }' <<<"$1" |
    sort -g | head -2 | awk '{ printf "%s%s", sep, $2; sep = "," }'
}
# peer_run NAME CMD...: runs CMD for at most PEER_TIMEOUT_S, keeps its output in
# LOG_DIR/NAME.log, prints it to stdout for the caller; when it fails, a last
# line `failed: why` (a PyTorch peer's failure is a row, not the end).
peer_run() {
  local name=$1 rc=0; shift
  echo "# $name: $*" >&2
  timeout "$peer_timeout" "$@" >"$log_dir/$name.log" 2>&1 || rc=$?
  cat "$log_dir/$name.log"
  if [[ $rc -eq 124 ]]; then echo "failed: timed out after $peer_timeout s"
  elif [[ $rc -ne 0 ]]; then
    echo "failed: $( (grep '^failed: ' "$log_dir/$name.log" || tail -n 1 "$log_dir/$name.log") |
                     tail -n 1 | sed 's/^failed: //') (full output: $log_dir/$name.log)"
  fi
  return 0
}
# run NAME CMD...: runs CMD, keeps its output in LOG_DIR/NAME.log, prints it to
# stdout for the caller; a failed run stops the script with its error.
run() {
  local name=$1; shift
  echo "# $name: $*" >&2
  "$@" >"$log_dir/$name.log" 2>&1 || bench_failed "$name (full output: $log_dir/$name.log)" "$(cat "$log_dir/$name.log")"
  cat "$log_dir/$name.log"
}

rows=() lines=()
# row CONFIG RUN RANKS OUT SINGLE_TPS DDP_TPS NOTE: one table row and its lines.
row() {
  local config=$1 name=$2 ranks=$3 out=$4 single=$5 ddp=$6 note=$7
  local tps eff="n/a" hidden vs key
  tps=$(field tokens_per_s "$out")
  [[ $ranks -gt 1 && -n $single && -n $tps ]] && eff=$(awk -v a="$tps" -v b="$single" -v n="$ranks" \
    'BEGIN { printf "%.2f", a / (n * b) }')
  hidden=$(field comm_hidden_share "$out")
  [[ $ranks -gt 1 ]] || hidden=""
  vs=$(ratio "$tps" "$ddp")
  [[ -n $tps ]] || note=$(grep -m1 '^failed: ' <<<"$out" | cut -c9-)
  rows+=("$(printf '%-9s %-24s %5s %10s %9s %8s %9s %9s %10s  %s' "$config" "$name" "$ranks" \
    "${tps:-failed}" "$vs" "$eff" "${hidden:-n/a}" "$(field comm_ms_per_step "$out")" \
    "$(field model_state_mb "$out")" "$note")")
  key=${config//-/_}_${name//[-.]/_}
  lines+=("${key}_tokens_per_s: ${tps:-n/a}" "${key}_ratio_vs_fastest_ddp: $vs")
  [[ $ranks -gt 1 ]] && lines+=("${key}_scaling_efficiency: $eff")
  [[ -n $hidden ]] && lines+=("${key}_comm_hidden_share: $hidden")
  return 0
}
# peer_name PEER OUT: the peer's rows' name, torch-VERSION[-compile], from its output.
peer_name() {
  local version
  version=$(field torch "$2")
  [[ -n $version ]] || { echo "$1"; return; }
  echo "torch-${version%%+*}$([[ $(field mode "$2") == compile ]] && echo -compile)"
}

# merged NAME: the median output (median_outputs) of run NAME's rounds in `runs`.
merged() {
  local outs=() r
  for ((r = 1; r <= repeats; r++)); do outs+=("${runs[$1:$r]}"); done
  median_outputs "${outs[@]}"
}

read -r -a peer_list <<<"$peers"
round_lines=()
for config in "${configs[@]}"; do
  cfg=$repo/examples/configs/$config.json
  echo "=== $config" >&2
  # runs[NAME:ROUND]: every run's output (NAME: PEER_INDEX-1, PEER_INDEX-ddp,
  # dtrain-1, BACKEND-stageN); failed[NAME]: a peer run's first failed output
  # (that run is not repeated).
  declare -A runs=() failed=()
  eager_setting=()
  for ((round = 1; round <= repeats; round++)); do
    sfx="" line="round $round/$repeats $config tokens/s:"
    [[ $round -gt 1 ]] && sfx=-r$round
    # ---- the PyTorch peers: one process, then DDP --------------------------
    for i in "${!peer_list[@]}"; do
      peer=${peer_list[$i]}
      args=(--config "$config" --steps "$steps" --warmup "$warmup" --sweep-steps "$sweep_steps")
      case $peer in
        debian) ppy=$py; t1_args=(--allow-coretype) ;;
        pypi) ppy=$pypi_python; t1_args=() ;;
        pypi-compile) ppy=$pypi_python; t1_args=(--mode compile) ;;
        *) echo "compare-ddp: unknown peer '$peer' (debian, pypi, pypi-compile)" >&2; exit 1 ;;
      esac
      if [[ -z $ppy ]]; then
        t1="failed: $pypi_error" tddp="failed: $pypi_error"
      elif [[ $round -eq 1 ]]; then   # the sweeps
        t1=$(peer_run "$config-$peer-1" "$ppy" "$repo/bench/pytorch_train.py" "${args[@]}" "${t1_args[@]}")
        variants=$(top_two_variants "$t1")
        variants=${variants:-$(field variant "$t1")}
        ddp_args=()
        if [[ $peer == pypi-compile ]]; then  # every setting compiles anew: one setting
          ddp_args=(--buckets "${eager_setting[0]:-25}" --bucket-views "${eager_setting[1]:-0}")
        fi
        if [[ -z $variants ]]; then
          tddp="failed: its single-process run failed"
        else
          tddp=$(peer_run "$config-$peer-ddp" "$ppy" "$repo/bench/pytorch_ddp.py" "${args[@]}" \
                   --variants "$variants" --single-tokens-per-s "$(field tokens_per_s "$t1")" \
                   "${ddp_args[@]}")
        fi
        if [[ $peer == pypi && -n $(field tokens_per_s "$tddp") ]]; then
          eager_setting=("$(field bucket_cap_mb "$tddp")" "$(field gradient_as_bucket_view "$tddp")")
        fi
      else   # rounds 2..N: round 1's choices again, no sweep
        t1="" tddp=""
        if [[ -z ${failed[$i-1]:-} ]]; then
          t1=$(peer_run "$config-$peer-1$sfx" "$ppy" "$repo/bench/pytorch_train.py" "${args[@]}" \
                 --variant "$(field variant "${runs[$i-1:1]}")" "${t1_args[@]}")
        fi
        if [[ -z ${failed[$i-ddp]:-} ]]; then
          first=${runs[$i-ddp:1]} single=()
          [[ -n $(field tokens_per_s "$t1") ]] && single=(--single-tokens-per-s "$(field tokens_per_s "$t1")")
          tddp=$(peer_run "$config-$peer-ddp$sfx" "$ppy" "$repo/bench/pytorch_ddp.py" "${args[@]}" \
                   --variants "$(field variant_best "$first")" --buckets "$(field bucket_cap_mb "$first")" \
                   --bucket-views "$(field gradient_as_bucket_view "$first")" "${single[@]}")
        fi
      fi
      for kind in 1 ddp; do
        key=$i-$kind
        if [[ -n ${failed[$key]:-} ]]; then line+=" $peer-$kind not-rerun"; continue; fi
        if [[ $kind == 1 ]]; then out=$t1; else out=$tddp; fi
        runs[$key:$round]=$out
        tps=$(field tokens_per_s "$out")
        [[ -n $tps ]] || failed[$key]=$out
        line+=" $peer-$kind ${tps:-failed}"
      done
    done

    # ---- dtrain: one process, then every backend and stage -----------------
    runs[dtrain-1:$round]=$(run "$config-dtrain-1$sfx" "$bench" train --config "$cfg" "${dtrain_args[@]}")
    line+=" dtrain-1 $(field tokens_per_s "${runs[dtrain-1:$round]}")"
    for backend in $backends; do
      for stage in $stages; do
        name=$backend-stage$stage
        store=()
        [[ $backend == gloo ]] && store=(-x "DTRAIN_STORE=127.0.0.1:$(free_port)")
        runs[$name:$round]=$(run "$config-dtrain-$name$sfx" "${mpirun[@]}" "${store[@]}" "$bench" train \
                               --config "$cfg" "${dtrain_args[@]}" --set "parallel.backend=$backend" \
                               --set "parallel.zero_stage=$stage")
        line+=" $name $(field tokens_per_s "${runs[$name:$round]}")"
      done
    done
    if [[ $repeats -gt 1 ]]; then echo "# $line" >&2; round_lines+=("$line"); fi
  done

  # ---- the table: medians over the rounds ----------------------------------
  names=() singles=() ddps=() best=-1
  for i in "${!peer_list[@]}"; do
    names+=("$(peer_name "${peer_list[$i]}" "${runs[$i-1:1]}")")
    singles+=("${failed[$i-1]:-$(merged "$i-1")}") ddps+=("${failed[$i-ddp]:-$(merged "$i-ddp")}")
    tps=$(field tokens_per_s "${ddps[-1]}")
    if [[ -n $tps ]] && { [[ $best -lt 0 ]] ||
         awk -v a="$tps" -v b="$(field tokens_per_s "${ddps[$best]}")" 'BEGIN { exit !(a > b) }'; }; then
      best=$(( ${#ddps[@]} - 1 ))
    fi
  done
  ddp_tps="" fastest=none
  if [[ $best -ge 0 ]]; then ddp_tps=$(field tokens_per_s "${ddps[$best]}") fastest=${names[$best]}-ddp; fi

  d1=$(merged dtrain-1)
  d1_tps=$(field tokens_per_s "$d1")
  for i in "${!names[@]}"; do
    t1=${singles[$i]} tddp=${ddps[$i]}
    row "$config" "${names[$i]}-1" 1 "$t1" "" "$ddp_tps" "$(field variant "$t1")"
    note="$(field variant_best "$tddp"), bucket_cap_mb $(field bucket_cap_mb "$tddp")"
    row "$config" "${names[$i]}-ddp" 2 "$tddp" "$(field tokens_per_s "$t1")" "$ddp_tps" \
      "$note, as_view $(field gradient_as_bucket_view "$tddp")"
  done
  row "$config" dtrain-1 1 "$d1" "" "$ddp_tps" "stage $(field zero_stage "$d1")"
  lines+=("${config//-/_}_fastest_ddp_peer: $fastest")
  for backend in $backends; do
    for stage in $stages; do
      out=$(merged "$backend-stage$stage")
      row "$config" "$backend-stage$stage" 2 "$out" "$d1_tps" "$ddp_tps" \
        "exposed comm $(field exposed_comm_ms_per_step "$out") ms/step"
    done
  done
  unset runs failed
done

echo
if [[ $repeats -gt 1 ]]; then
  printf '%s\n' "${round_lines[@]}"
  echo "# the table and name: value lines: medians over these $repeats rounds (ratios and" \
    "scaling of the medians)"
  echo
fi
printf '%-9s %-24s %5s %10s %9s %8s %9s %9s %10s  %s\n' config run ranks tokens/s vs_ddp \
  scaling hidden comm_ms state_MB note
printf '%s\n' "${rows[@]}"
echo "# vs_ddp: tokens/s over the fastest PyTorch DDP peer's (CONFIG_fastest_ddp_peer below)"
echo
printf '%s\n' "${lines[@]}"
