# Sourced by the benchmark scripts (bench/*.sh).

# bench_failed WHAT OUTPUT: a run failed. Prints the last lines of its OUTPUT
# (where the worker's error is) and stops the script with exit code 1: a
# figure measured after a failure would mean nothing.
bench_failed() {
  echo "$(basename "$0"): $1 failed; the last lines of its output:" >&2
  tail -n 25 <<<"$2" | sed 's/^/  /' >&2
  exit 1
}

# median: the median of the numbers on stdin, one a line; for an even count
# the mean of the two middle ones, to as many decimals as they have. Prints
# nothing for no input.
median() {
  sort -g | awk -v OFMT=%.10g '{ v[NR] = $1 }
    END {
      if (!NR) exit
      if (NR % 2) { print v[(NR + 1) / 2]; exit }
      a = v[NR / 2]; b = v[NR / 2 + 1]
      if (a b ~ /[eE]/) { print (a + b) / 2; exit }
      d = index(a, ".") ? length(a) - index(a, ".") : 0
      if (index(b, ".") && length(b) - index(b, ".") > d) d = length(b) - index(b, ".")
      if (d == 0 && (a + b) % 2) d = 1   # two integers: a half stays
      printf "%." d "f\n", (a + b) / 2
    }'
}

# median_outputs OUTPUT...: the first OUTPUT (a run's `name: value` lines and
# whatever else it printed) with each `name: NUMBER` line's value replaced by
# the median of that name's values over all OUTPUTs; a name some OUTPUT lacks
# keeps the first OUTPUT's value, and every other line stays as it is. One
# OUTPUT comes back unchanged.
median_outputs() {
  local line key out value values
  while IFS= read -r line; do
    if [[ $# -gt 1 && $line =~ ^([A-Za-z0-9_]+):\ +-?[0-9.]+([eE][-+]?[0-9]+)?$ ]]; then
      key=${BASH_REMATCH[1]} values=()
      for out in "$@"; do
        value=$(awk -v k="$key:" '$1 == k { print $2; exit }' <<<"$out")
        [[ -n $value ]] && values+=("$value")
      done
      [[ ${#values[@]} -eq $# ]] && line="$key: $(printf '%s\n' "${values[@]}" | median)"
    fi
    printf '%s\n' "$line"
  done <<<"$1"
}
