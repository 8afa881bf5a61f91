#!/usr/bin/env bash
# dtrain against PyTorch on the same models, one CPU thread each:
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
#
#   bench/compare-pytorch.sh                 # both configs, 10 timed steps
#   STEPS=20 VARIANT=openblas PEERS=debian BUILD_DIR=build bench/compare-pytorch.sh lm-small
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
steps=${STEPS:-10}
variant=${VARIANT:-auto}
precisions=${PRECISIONS:-fp32 bf16}
peers=${PEERS:-debian pypi pypi-compile}
peer_timeout=${PEER_TIMEOUT_S:-2700}
build=${BUILD_DIR:-$repo/build}
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(lm-small cls-seed)

# One thread everywhere; OpenMP pools must not spin against each other.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

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

# peer_run PEER CONFIG: that peer's bench/pytorch_train.py output (its stderr
# passes through); on failure (or timeout) a `failed: why` line ends it.
peer_run() {
  local peer=$1 config=$2 py args=(--config "$2" --steps "$steps" --variant auto) err rc=0
  case $peer in
    debian) py=/usr/bin/python3; args=(--config "$config" --steps "$steps" --variant "$variant"
                                       --allow-coretype) ;;
    pypi) py=$pypi_python ;;
    pypi-compile) py=$pypi_python; args+=(--mode compile) ;;
    *) echo "failed: unknown peer '$peer' (debian, pypi, pypi-compile)"; return ;;
  esac
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

rows=() summary=()
for config in "${configs[@]}"; do
  names=() tps=() outs=()
  for peer in $peers; do
    echo "=== PyTorch ($peer): $config"
    out=$(peer_run "$peer" "$config")
    echo "$out"
    names+=("$(peer_name "$peer" "$out")") tps+=("$(field tokens_per_s "$out")") outs+=("$out")
  done

  # ---- dtrain side: one run per precision ---------------------------------
  declare -A dtrain_tps=() dtrain_mfu=()
  for precision in $precisions; do
    if [[ -x $build/bin/dtrain-bench ]]; then
      echo "=== dtrain ($precision): $config"
      dtrain_out=$("$build/bin/dtrain-bench" train --config "$repo/examples/configs/$config.json" \
                     --set "precision=$precision")
      echo "$dtrain_out"
      dtrain_tps[$precision]=$(field tokens_per_s "$dtrain_out")
      dtrain_mfu[$precision]=$(field mfu "$dtrain_out")
    else
      echo "=== dtrain: $build/bin/dtrain-bench not built; PyTorch figures only"
    fi
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
  unset dtrain_tps dtrain_mfu
done

echo
header=$(printf '%-10s %-20s %-30s %14s %9s' config peer torch_variant torch_tokens/s torch_mfu)
for precision in $precisions; do header+=$(printf ' %9s' "$precision/pt"); done
echo "$header   (dtrain tokens/s over the peer's, per dtrain precision)"
printf '%s\n' "${rows[@]}"
echo
printf '%-10s %-9s %16s %10s %-20s %14s %13s\n' config precision dtrain_tokens/s dtrain_mfu \
  fastest_peer peer_tokens/s dtrain/fastest
printf '%s\n' "${summary[@]}"
echo "# command: STEPS=$steps VARIANT=$variant PRECISIONS=\"$precisions\" PEERS=\"$peers\"" \
  "bench/compare-pytorch.sh ${configs[*]}"
