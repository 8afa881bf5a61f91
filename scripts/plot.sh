#!/usr/bin/env bash
# scripts/plot.sh RUN_DIR: draws RUN_DIR/metrics.jsonl with gnuplot (Debian
# package gnuplot-nox) into RUN_DIR/plots/: loss.png (training loss, and the
# eval loss), eval.png (eval accuracy for a classifier, perplexity for an LM)
# and tokens_per_s.png, each over steps. Exit 2 on usage errors or when
# gnuplot is missing.
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1/metrics.jsonl" ]]; then
  echo "usage: scripts/plot.sh RUN_DIR (a directory holding metrics.jsonl)" >&2
  exit 2
fi
if ! command -v gnuplot >/dev/null; then
  echo "plot.sh: gnuplot is not installed: apt-get install gnuplot-nox (scripts/setup.sh does)" >&2
  exit 2
fi
run="$1"
out="$run/plots"
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

# metrics.jsonl -> whitespace-separated columns per kind of line. The lines
# are flat JSON objects, so a field is found by its quoted name.
awk -v dir="$data" '
  function field(name,   m) {
    if (match($0, "\"" name "\":[-+0-9.eEinfa]+")) return substr($0, RSTART + length(name) + 3, RLENGTH - length(name) - 3)
    return ""
  }
  /"event":"eval"/ {
    acc = field("accuracy"); ppl = field("perplexity")
    print field("step"), field("loss"), (acc != "" ? acc : "NaN"), (ppl != "" ? ppl : "NaN") > (dir "/eval.dat")
    next
  }
  /"event"/ { next }
  { print field("step"), field("loss"), field("tokens_per_s") > (dir "/train.dat") }
' "$run/metrics.jsonl"
touch "$data/train.dat" "$data/eval.dat"
if [[ ! -s "$data/train.dat" ]]; then
  echo "plot.sh: $run/metrics.jsonl has no step lines yet" >&2
  exit 1
fi

has_eval=$([[ -s "$data/eval.dat" ]] && echo 1 || echo 0)
has_acc=$(awk '$3 != "NaN" { n++ } END { print (n > 0 ? 1 : 0) }' "$data/eval.dat")

gnuplot <<GNUPLOT
set terminal pngcairo size 900,500 noenhanced
set grid
set key top right
set xlabel "step"

set output "$out/loss.png"
set title "loss: $run"
set ylabel "loss"
if ($has_eval) {
  plot "$data/train.dat" using 1:2 with lines title "train", "$data/eval.dat" using 1:2 with linespoints title "eval"
} else {
  plot "$data/train.dat" using 1:2 with lines title "train"
}

set output "$out/tokens_per_s.png"
set title "throughput: $run"
set ylabel "tokens/s"
plot "$data/train.dat" using 1:3 with lines title "tokens/s"

if ($has_eval) {
  set output "$out/eval.png"
  if ($has_acc) {
    set title "eval accuracy: $run"
    set ylabel "accuracy"
    plot "$data/eval.dat" using 1:3 with linespoints title "accuracy"
  } else {
    set title "eval perplexity: $run"
    set ylabel "perplexity"
    plot "$data/eval.dat" using 1:4 with linespoints title "perplexity"
  }
}
GNUPLOT
echo "plot.sh: wrote $(ls "$out"/*.png | tr '\n' ' ')"
