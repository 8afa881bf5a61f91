#!/usr/bin/env bash
# dtrain against PyTorch on the same models, one CPU thread each:
# lm-small and cls-seed (examples/configs). PyTorch runs its fastest fp32
# variant (bench/pytorch_train.py --variant auto); dtrain runs
# `dtrain-bench train --config ... --set precision=P` for every P in
# PRECISIONS (default "fp32 bf16": mixed precision against the same fp32
# PyTorch baseline) when that binary is built.
# PyTorch's sweep includes OpenBLAS with its own AVX-512 kernels
# (--allow-coretype, in its child processes only), so the baseline is
# PyTorch at its best on this machine, not at the environment's AVX2 pin.
#
#   bench/compare-pytorch.sh                 # both configs, 10 timed steps
#   STEPS=20 VARIANT=openblas BUILD_DIR=build bench/compare-pytorch.sh lm-small
#   PRECISIONS=bf16 bench/compare-pytorch.sh cls-seed
#
# Prints each run's figures, then one summary line per config and precision:
#   config  torch_variant  torch_tokens/s  torch_mfu  precision  dtrain_tokens/s  dtrain_mfu  dtrain/torch
# (tokens/s from the mean step on both sides; MFU against each side's own
# measured 2048^3 fp32 GEMM peak, for bf16 too, so bf16 MFU can exceed 1's
# share of that peak; PyTorch always trains in fp32.)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${STEPS:-10}
variant=${VARIANT:-auto}
precisions=${PRECISIONS:-fp32 bf16}
build=${BUILD_DIR:-$repo/build}
configs=("$@")
[[ ${#configs[@]} -gt 0 ]] || configs=(lm-small cls-seed)

# One thread everywhere; OpenMP pools must not spin against each other.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE

# field NAME TEXT: the value of the `NAME: value` line in TEXT (empty if none).
field() { awk -v k="$1:" '$1 == k { print $2; exit }' <<<"$2"; }

summary=()
for config in "${configs[@]}"; do
  echo "=== PyTorch: $config"
  torch_out=$(/usr/bin/python3 "$repo/bench/pytorch_train.py" --config "$config" \
                --steps "$steps" --variant "$variant" --allow-coretype)
  echo "$torch_out"
  torch_tps=$(field tokens_per_s "$torch_out")

  # ---- dtrain side: one run per precision ---------------------------------
  for precision in $precisions; do
    dtrain_tps="" dtrain_mfu=""
    if [[ -x $build/bin/dtrain-bench ]]; then
      echo "=== dtrain ($precision): $config"
      dtrain_out=$("$build/bin/dtrain-bench" train --config "$repo/examples/configs/$config.json" \
                     --set "precision=$precision")
      echo "$dtrain_out"
      dtrain_tps=$(field tokens_per_s "$dtrain_out")
      dtrain_mfu=$(field mfu "$dtrain_out")
    else
      echo "=== dtrain: $build/bin/dtrain-bench not built; PyTorch figures only"
    fi
    ratio="n/a"
    if [[ -n $dtrain_tps && -n $torch_tps ]]; then
      ratio=$(awk -v a="$dtrain_tps" -v b="$torch_tps" 'BEGIN { printf "%.2f", a / b }')
    fi
    summary+=("$(printf '%-10s %-22s %14s %9s %-9s %16s %10s %12s' "$config" \
      "$(field variant "$torch_out")" "$torch_tps" "$(field mfu "$torch_out")" "$precision" \
      "${dtrain_tps:-n/a}" "${dtrain_mfu:-n/a}" "$ratio")")
  done
done

echo
printf '%-10s %-22s %14s %9s %-9s %16s %10s %12s\n' config torch_variant torch_tokens/s torch_mfu \
  precision dtrain_tokens/s dtrain_mfu dtrain/torch
printf '%s\n' "${summary[@]}"
echo "# command: STEPS=$steps VARIANT=$variant PRECISIONS=\"$precisions\" bench/compare-pytorch.sh ${configs[*]}"
