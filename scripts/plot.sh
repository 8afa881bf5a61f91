#!/usr/bin/env bash
# scripts/plot.sh RUN_DIR: draws RUN_DIR/metrics.jsonl with gnuplot (Debian
# package gnuplot-nox) into RUN_DIR/plots/: loss.png (training loss, and the
# eval loss), eval.png (eval accuracy for a classifier, perplexity for an LM),
# lr.png (learning rate), grad_norm.png (gradient norm before clipping) and
# the throughput from 0 up: tokens_per_s.png for an LM, samples_per_s.png for
# a classifier (tokens/s over the sequence length of RUN_DIR/config.json),
# each over steps. Exit 2 on usage errors or when gnuplot is missing.
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
  { print field("step"), field("loss"), field("tokens_per_s"), field("lr"), field("grad_norm") > (dir "/train.dat") }
' "$run/metrics.jsonl"
touch "$data/train.dat" "$data/eval.dat"
if [[ ! -s "$data/train.dat" ]]; then
  echo "plot.sh: $run/metrics.jsonl has no step lines yet" >&2
  exit 1
fi

has_eval=$([[ -s "$data/eval.dat" ]] && echo 1 || echo 0)
has_acc=$(awk '$3 != "NaN" { n++ } END { print (n > 0 ? 1 : 0) }' "$data/eval.dat")

# A classifier's throughput in samples/s: one sample is seq tokens (the
# resolved config's data.seq_len; Fashion-MNIST: (28 / model.patch_size)^2
# patches). Without config.json the plot stays in tokens/s.
seq=0
if [[ -f "$run/config.json" ]]; then
  seq=$(awk '
    /^  "[a-z_]+": \{/ { section = $1; gsub(/[":]/, "", section) }
    { gsub(/[",]/, "") }
    section == "model" && $1 == "kind:" { model = $2 }
    section == "model" && $1 == "patch_size:" { patch = $2 }
    section == "data" && $1 == "kind:" { data = $2 }
    section == "data" && $1 == "seq_len:" { len = $2 }
    END {
      if (model != "classifier") print 0
      else if (data == "fashion_mnist" && patch > 0) print int(28 / patch) * int(28 / patch)
      else print len + 0
    }' "$run/config.json")
fi
throughput_col=3 throughput_unit="tokens/s" throughput_png="tokens_per_s.png"
if [[ $seq -gt 0 ]]; then
  throughput_col="(\$3 / $seq)" throughput_unit="samples/s" throughput_png="samples_per_s.png"
fi

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

set output "$out/lr.png"
set title "learning rate: $run"
set ylabel "learning rate"
plot "$data/train.dat" using 1:4 with lines title "lr"

set output "$out/grad_norm.png"
set title "gradient norm (before clipping): $run"
set ylabel "gradient norm"
plot "$data/train.dat" using 1:5 with lines title "grad norm"

set output "$out/$throughput_png"
set title "throughput: $run"
set ylabel "$throughput_unit"
set yrange [0:*]
plot "$data/train.dat" using 1:$throughput_col with lines title "$throughput_unit"
set autoscale y

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
