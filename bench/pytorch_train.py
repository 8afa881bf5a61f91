#!/usr/bin/python3
"""PyTorch baseline for dtrain: trains the same pre-LN Transformers as dtrain's
example configs (examples/configs/{lm-small,cls-seed}.json) on one CPU thread
and prints tokens/s and MFU, at the fastest PyTorch settings found on this
machine kind.

  bench/pytorch_train.py --config lm-small --steps 10 --variant auto
  .venv-torch/bin/python bench/pytorch_train.py --config lm-small --mode compile

Runs under Debian's python3-torch 1.13 (/usr/bin/python3) or PyPI's torch 2.x
(scripts/setup-torch.sh). --variant auto times every variant that applies to
this interpreter and --mode (eager, or torch.compile on torch 2.x) for a few
steps, each in its own process, since BLAS library and malloc policy are fixed
at process start; prints the table, then times the fastest for --steps (a
single candidate skips the sweep). --variant NAME runs one variant. Every
child process has --timeout-s; a child that fails or times out is a failed row
with its reason. The last lines are `name: value` pairs for scripts
(bench/compare-pytorch.sh).

FLOPs per token = 6 * N_matmul + 12 * L * d * T, N_matmul = weights of the
matmuls (QKV, out proj, fc1, fc2 per layer, plus LM or classifier head);
MFU = tokens/s * FLOPs per token / gemm_peak, gemm_peak = the variant's own
best fp32 2048^3 matmul on the same thread count. tokens/s and step_ms use the
mean step (as dtrain-bench does); *_best / step_ms_min the fastest one (least
disturbed by other processes on a shared machine).
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

from pytorch_models import (VARIANTS, blas_library, candidates, compile_model, flops_per_token,
                            gemm_peak_gflops, interpreter, load_config, make_optimizer,
                            parse_figures, prepare_model, timed_steps, variant_env,
                            warmup_steps)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="lm-small",
                   help="lm-small | cls-seed | path to a dtrain JSON config")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--variant", default="auto", help="auto | " + " | ".join(VARIANTS))
    p.add_argument("--mode", choices=["eager", "compile"], default="eager",
                   help="which variants auto sweeps: eager, or torch.compile (torch 2.x)")
    p.add_argument("--timeout-s", type=int, default=900,
                   help="per child process (torch.compile compiles in its first steps)")
    p.add_argument("--sweep-steps", type=int, default=3, help="timed steps per variant in auto")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--allow-coretype", action="store_true",
                   help="let auto also try variants that override OPENBLAS_CORETYPE")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()



def run_variant(args, c):
    """Trains in this process; prints the variant's figures as name: value lines."""
    import torch
    var = VARIANTS[args.variant]
    model = prepare_model(c, var, args.threads)
    opt = make_optimizer(model, c)
    model = compile_model(model, var)
    gen = torch.Generator().manual_seed(1)
    times, loss = timed_steps(model, opt, c, gen, warmup_steps(var, args.warmup), args.steps)
    step_s = statistics.mean(times)  # as dtrain-bench: tokens/s from the mean step
    tokens_per_s = c["batch"] * c["seq"] / step_s
    peak = gemm_peak_gflops(var["linear"])
    mfu = tokens_per_s * flops_per_token(c) / (peak * 1e9)
    print(f"config: {c['name']}")
    print(f"variant: {args.variant}")
    print(f"torch: {torch.__version__}")
    print(f"mode: {'compile' if var['compile'] else 'eager'}")
    print(f"blas: {blas_library()}")
    print(f"threads: {torch.get_num_threads()}")
    print(f"steps: {args.steps}")
    print(f"final_loss: {loss.item():.4f}")
    print(f"step_ms: {step_s * 1e3:.1f}")
    print(f"step_ms_median: {statistics.median(times) * 1e3:.1f}")
    print(f"step_ms_min: {min(times) * 1e3:.1f}")
    print(f"tokens_per_s: {tokens_per_s:.1f}")
    print(f"tokens_per_s_best: {c['batch'] * c['seq'] / min(times):.1f}")
    print(f"flops_per_token: {flops_per_token(c)}")
    print(f"gemm_peak_gflops: {peak:.1f}")
    print(f"mfu: {mfu:.4f}")


def child_command(args, variant, steps):
    return [sys.executable, str(Path(__file__).resolve()), "--config", args.config,
            "--variant", variant, "--steps", str(steps), "--warmup", str(args.warmup),
            "--threads", str(args.threads), "--child"]


def run_child(args, variant, steps):
    """Runs one variant in its own process: (figures, None) or (None, reason)."""
    try:
        res = subprocess.run(child_command(args, variant, steps),
                             env=variant_env(variant, args.threads),
                             capture_output=True, text=True, timeout=args.timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {args.timeout_s} s"
    if res.returncode != 0:
        print(f"# {variant} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
        lines = res.stderr.strip().splitlines() or [f"exit status {res.returncode}"]
        return None, lines[-1][:200]
    return parse_figures(res.stdout), None


def print_table(rows):
    print(f"{'variant':<30} {'step_ms':>9} {'best_ms':>9} {'tokens/s':>10} {'peak GF/s':>10} "
          f"{'MFU':>7}  note")
    for name, fig in rows:
        if fig is None:
            print(f"{name:<30} {'failed':>9}")
            continue
        print(f"{name:<30} {float(fig['step_ms']):>9.1f} {float(fig['step_ms_min']):>9.1f} "
              f"{float(fig['tokens_per_s']):>10.1f} "
              f"{float(fig['gemm_peak_gflops']):>10.1f} {float(fig['mfu']):>7.3f}  "
              f"{VARIANTS[name]['note']}")
    sys.stdout.flush()


def main():
    args = parse_args()
    c = load_config(args.config)
    if args.variant != "auto" and args.variant not in VARIANTS:
        sys.exit(f"unknown variant '{args.variant}'; one of: auto, {', '.join(VARIANTS)}")
    if args.child:
        run_variant(args, c)
        return
    variants = candidates(args.mode, args.allow_coretype) if args.variant == "auto" else []
    if args.variant == "auto" and not variants:
        sys.exit(f"failed: no {args.mode} variant for this torch")
    if len(variants) > 1:
        print(f"# sweep: {c['name']}, {args.mode}, {args.warmup} warm-up + {args.sweep_steps} "
              f"timed steps each, {args.threads} thread(s)")
        rows, reasons = [], []
        for v in variants:
            fig, reason = run_child(args, v, args.sweep_steps)
            rows.append((v, fig))
            reasons += [f"{v}: {reason}"] if reason else []
        print_table(rows)
        ok = [(name, fig) for name, fig in rows if fig is not None]
        if not ok:
            sys.exit("failed: every variant failed; " + "; ".join(reasons))
        # The fastest single step ranks variants: on a shared machine it is the
        # figure least disturbed by other processes.
        best = min(ok, key=lambda r: float(r[1]["step_ms_min"]))[0]
        print(f"# fastest: {best}; timing it for {args.steps} steps")
    else:
        best = variants[0] if variants else args.variant
    fig, reason = run_child(args, best, args.steps)
    if fig is None:
        sys.exit(f"failed: variant {best}: {reason}")
    print_table([(best, fig)])
    print("# command: " + " ".join([interpreter(), "bench/pytorch_train.py", "--config",
                                    args.config, "--steps", str(args.steps), "--variant", best]))
    for key, value in fig.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
