#!/usr/bin/env bash
# dtrain against PyTorch on the same models, one CPU thread each (THREADS=N: N each):
# lm-small and cls-seed (examples/configs). Every PyTorch peer in PEERS runs
# bench/pytorch_train.py at its fastest fp32 variant (--variant auto), in the
# same run as dtrain:
#   debian        Debian's python3-torch 1.13 (/usr/bin/python3), eager; its
#                 sweep covers BLAS libraries, malloc policy, oneDNN Linear and
#                 TorchScript, OpenBLAS's own AVX-512 kernels included
#                 (--allow-coretype, in its child processes only)
#   pypi          PyPI's torch 2.x (scripts/setup-torch.sh installs it into
#                 .venv-torch/ on first use, ~5 GB), eager
#   pypi-compile  the same torch with torch.compile (inductor, C++ on CPU)
# so the baseline is PyTorch at its best on this machine, not at the
# environment's AVX2 pin. A peer that fails (or runs past PEER_TIMEOUT_S) is a
# row that says why; dtrain's own failures stop the script. dtrain runs
# `dtrain-bench train --config ... --set precision=P` for every P in
# PRECISIONS (default "fp32 bf16": mixed precision against the same fp32
# PyTorch baselines) when that binary is built.
# REPEATS=N (default 1) takes every figure N times, interleaved in rounds (per
# config: each peer, then dtrain at each precision; again N times), so the
# machine's drift reaches both sides alike. Round 1 is the one above; rounds
# 2..N rerun each peer at the variant its round 1 chose (no second sweep). The
# tables then give medians over the rounds: each side's tokens/s and MFU, and
# the ratios as median over median; every round's tokens/s is printed as it
# finishes and again above the tables. A peer that fails in any round is not
# rerun, and its row says why it first failed.
#
#   bench/compare-pytorch.sh                 # both configs, 10 timed steps
#   STEPS=20 VARIANT=openblas PEERS=debian BUILD_DIR=build bench/compare-pytorch.sh lm-small
#   REPEATS=5 PRECISIONS=fp32 PEERS=debian bench/compare-pytorch.sh lm-small
#   PRECISIONS=bf16 PEERS="pypi pypi-compile" bench/compare-pytorch.sh cls-seed
#
# Prints each run's figures, then a row per config and peer (its tokens/s,
# MFU, and dtrain's tokens/s over the peer's for each precision), then one
# summary line per config and precision against the fastest peer:
#   config  precision  dtrain_tokens/s  dtrain_mfu  fastest_peer  peer_tokens/s  dtrain/fastest
# (tokens/s from the mean step on both sides; MFU against each side's own
# measured 2048^3 fp32 GEMM peak, for bf16 too, so bf16 MFU can exceed 1's
# share of that peak; PyTorch always trains in fp32.) VARIANT (default auto)
# applies to the debian peer; the pypi peers always sweep their own variants.
# The debian peer's OpenBLAS is Debian's libopenblas0-pthread (scripts/setup.sh
# --bench), or the folder OPENBLAS_DIR names; without it "openblas" is the
# reference BLAS. torch.compile's first run here compiles for minutes; inductor
# caches what it built (/tmp/torchinductor_$USER), so later runs start fast.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$repo/bench/lib.sh"   # median, median_outputs
steps=${STEPS:-10}
repeats=${REPEATS:-1}
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "compare-pytorch: REPEATS must be 1 or more" >&2; exit 2; }
variant=${VARIANT:-auto}
precisions=${PRECISIONS:-fp32 bf16}
peers=${PEERS:-debian pypi pypi-compile}
peer_timeout=${PEER_TIMEOUT_S:-2700}
build=${BUILD_DIR:-$repo/build}
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(lm-small cls-seed)

# THREADS (default 1) threads everywhere; OpenMP pools must not spin against each other.
threads=${THREADS:-1}
[[ $threads =~ ^[1-9][0-9]*$ ]] || { echo "compare-pytorch: THREADS must be 1 or more" >&2; exit 2; }
export OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=$threads MKL_NUM_THREADS=$threads OMP_WAIT_POLICY=PASSIVE

# field NAME TEXT: the value of the `NAME: value` line in TEXT (empty if none).
field() { awk -v k="$1:" '$1 == k { print $2; exit }' <<<"$2"; }
# ratio A B: A / B to 2 decimals, n/a when either is missing.
ratio() {
  if [[ -n $1 && -n $2 ]]; then awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'
  else echo n/a; fi
}

# peer_name PEER OUT: the peer's name in the tables, torch-VERSION[-compile].
peer_name() {
  local version
  version=$(field torch "$2")
  [[ -n $version ]] || { echo "$1"; return; }
  echo "torch-${version%%+*}$([[ $(field mode "$2") == compile ]] && echo -compile)"
}

# PyPI's torch, installed on first use; a failed install fails its peers only.
pypi_python="" pypi_error=""
if [[ " $peers " == *" pypi"* ]]; then
  pypi_python=$("$repo/scripts/setup-torch.sh") || pypi_error="scripts/setup-torch.sh failed"
fi

# peer_run PEER CONFIG [VARIANT]: that peer's bench/pytorch_train.py output
# (its stderr passes through) at VARIANT (default: auto, or VARIANT= for the
# debian peer); on failure (or timeout) a `failed: why` line ends it.
peer_run() {
  local peer=$1 config=$2 py args=(--config "$2" --steps "$steps" --variant "${3:-auto}") err rc=0
  case $peer in
    debian) py=/usr/bin/python3; args=(--config "$config" --steps "$steps" --variant "${3:-$variant}"
                                       --allow-coretype) ;;
    pypi) py=$pypi_python ;;
    pypi-compile) py=$pypi_python; args+=(--mode compile) ;;
    *) echo "failed: unknown peer '$peer' (debian, pypi, pypi-compile)"; return ;;
  esac
  args+=(--threads "$threads")
  [[ -n $py ]] || { echo "failed: ${pypi_error:-no interpreter}"; return; }
  err=$(mktemp)
  timeout "$peer_timeout" "$py" "$repo/bench/pytorch_train.py" "${args[@]}" 2>"$err" || rc=$?
  cat "$err" >&2
  if [[ $rc -eq 124 ]]; then echo "failed: timed out after $peer_timeout s"
  elif [[ $rc -ne 0 ]]; then
    echo "failed: $( (grep '^failed: ' "$err" || tail -n 1 "$err") | tail -n 1 | sed 's/^failed: //')"
  fi
  rm -f "$err"
}

read -r -a peer_list <<<"$peers"
rows=() summary=() round_lines=()
for config in "${configs[@]}"; do
  # runs[PEER_INDEX:ROUND], dtrain_runs[PRECISION:ROUND]: each run's output;
  # failed[PEER_INDEX]: a peer's first failed output (it is not rerun).
  declare -A runs=() dtrain_runs=() failed=()
  for ((round = 1; round <= repeats; round++)); do
    tag="" line="round $round/$repeats $config tokens/s:"
    [[ $repeats -gt 1 ]] && tag=", round $round/$repeats"
    for i in "${!peer_list[@]}"; do
      peer=${peer_list[$i]}
      if [[ -n ${failed[$i]:-} ]]; then line+=" $peer not-rerun"; continue; fi
      chosen=""   # rounds 2..N: the variant round 1 chose
      [[ $round -gt 1 ]] && chosen=$(field variant "${runs[$i:1]}")
      echo "=== PyTorch ($peer$tag): $config"
      out=$(peer_run "$peer" "$config" "$chosen")
      echo "$out"
      runs[$i:$round]=$out
      tps=$(field tokens_per_s "$out")
      [[ -n $tps ]] || failed[$i]=$out
      line+=" $peer ${tps:-failed}"
    done

    # ---- dtrain side: one run per precision -------------------------------
    for precision in $precisions; do
      if [[ -x $build/bin/dtrain-bench ]]; then
        echo "=== dtrain ($precision$tag): $config"
        dtrain_out=$("$build/bin/dtrain-bench" train --config "$repo/examples/configs/$config.json" \
                       --set "precision=$precision")
        echo "$dtrain_out"
        dtrain_runs[$precision:$round]=$dtrain_out
        line+=" dtrain-$precision $(field tokens_per_s "$dtrain_out")"
      elif [[ $round -eq 1 ]]; then
        echo "=== dtrain: $build/bin/dtrain-bench not built; PyTorch figures only"
      fi
    done
    if [[ $repeats -gt 1 ]]; then echo "# $line"; round_lines+=("$line"); fi
  done

  # ---- medians over the rounds -------------------------------------------
  names=() tps=() outs=()
  for i in "${!peer_list[@]}"; do
    if [[ -n ${failed[$i]:-} ]]; then
      out=${failed[$i]}
    else
      round_outs=()
      for ((round = 1; round <= repeats; round++)); do round_outs+=("${runs[$i:$round]}"); done
      out=$(median_outputs "${round_outs[@]}")
    fi
    names+=("$(peer_name "${peer_list[$i]}" "${runs[$i:1]}")") tps+=("$(field tokens_per_s "$out")")
    outs+=("$out")
  done
  declare -A dtrain_tps=() dtrain_mfu=()
  for precision in $precisions; do
    [[ -n ${dtrain_runs[$precision:1]:-} ]] || continue
    round_outs=()
    for ((round = 1; round <= repeats; round++)); do round_outs+=("${dtrain_runs[$precision:$round]}"); done
    dtrain_out=$(median_outputs "${round_outs[@]}")
    dtrain_tps[$precision]=$(field tokens_per_s "$dtrain_out")
    dtrain_mfu[$precision]=$(field mfu "$dtrain_out")
  done

  best=-1
  for i in "${!names[@]}"; do
    out=${outs[$i]} ratios=""
    for precision in $precisions; do
      ratios+=$(printf ' %9s' "$(ratio "${dtrain_tps[$precision]:-}" "${tps[$i]}")")
    done
    if [[ -n ${tps[$i]} ]]; then
      rows+=("$(printf '%-10s %-20s %-30s %14s %9s%s' "$config" "${names[$i]}" \
        "$(field variant "$out")" "${tps[$i]}" "$(field mfu "$out")" "$ratios")")
      if [[ $best -lt 0 ]] || awk -v a="${tps[$i]}" -v b="${tps[$best]}" 'BEGIN { exit !(a > b) }'; then
        best=$i
      fi
    else
      rows+=("$(printf '%-10s %-20s %s' "$config" "${names[$i]}" "$(grep -m1 '^failed: ' <<<"$out")")")
    fi
  done
  for precision in $precisions; do
    fastest=none fastest_tps=""
    [[ $best -ge 0 ]] && fastest=${names[$best]} fastest_tps=${tps[$best]}
    summary+=("$(printf '%-10s %-9s %16s %10s %-20s %14s %13s' "$config" "$precision" \
      "${dtrain_tps[$precision]:-n/a}" "${dtrain_mfu[$precision]:-n/a}" "$fastest" \
      "${fastest_tps:-n/a}" "$(ratio "${dtrain_tps[$precision]:-}" "$fastest_tps")")")
  done
  unset dtrain_tps dtrain_mfu runs dtrain_runs failed
done

echo
if [[ $repeats -gt 1 ]]; then
  printf '%s\n' "${round_lines[@]}"
  echo "# the tables: medians over these $repeats rounds (tokens/s, MFU; ratios of the medians)"
  echo
fi
header=$(printf '%-10s %-20s %-30s %14s %9s' config peer torch_variant torch_tokens/s torch_mfu)
for precision in $precisions; do header+=$(printf ' %9s' "$precision/pt"); done
echo "$header   (dtrain tokens/s over the peer's, per dtrain precision)"
printf '%s\n' "${rows[@]}"
echo
printf '%-10s %-9s %16s %10s %-20s %14s %13s\n' config precision dtrain_tokens/s dtrain_mfu \
  fastest_peer peer_tokens/s dtrain/fastest
printf '%s\n' "${summary[@]}"
echo "# command: THREADS=$threads REPEATS=$repeats STEPS=$steps VARIANT=$variant PRECISIONS=\"$precisions\" PEERS=\"$peers\"" \
  "bench/compare-pytorch.sh ${configs[*]}"
