# Sourced by the benchmark scripts (bench/*.sh).

# bench_failed WHAT OUTPUT: a run failed. Prints the last lines of its OUTPUT
# (where the worker's error is) and stops the script with exit code 1: a
# figure measured after a failure would mean nothing.
bench_failed() {
  echo "$(basename "$0"): $1 failed; the last lines of its output:" >&2
  tail -n 25 <<<"$2" | sed 's/^/  /' >&2
  exit 1
}
