#!/usr/bin/python3
"""PyTorch baseline for dtrain: trains the same pre-LN Transformers as dtrain's
example configs (examples/configs/{lm-small,cls-seed}.json) on one CPU thread
and prints tokens/s and MFU, at the fastest PyTorch settings found on this
machine kind.

  bench/pytorch_train.py --config lm-small --steps 10 --variant auto

--variant auto times every variant for a few steps (each in its own process,
since BLAS library and malloc policy are fixed at process start), prints the
table, then times the fastest for --steps. --variant NAME runs one variant.
The last lines are `name: value` pairs for scripts (bench/compare-pytorch.sh).

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
import time
from pathlib import Path

from pytorch_models import (CORETYPE_VARIANTS, VARIANTS, blas_library, prepare_model,
                            flops_per_token, gemm_peak_gflops, load_config, make_batch,
                            make_optimizer, parse_figures, variant_env)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="lm-small",
                   help="lm-small | cls-seed | path to a dtrain JSON config")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--variant", default="auto", help="auto | " + " | ".join(VARIANTS))
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
    gen = torch.Generator().manual_seed(1)
    times = []
    # The profiling executor optimises a scripted graph after a few runs.
    warmup = max(args.warmup, 5) if var["jit"] else args.warmup
    for step in range(warmup + args.steps):
        tokens, targets = make_batch(c, gen)
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()
        opt.zero_grad(set_to_none=False)  # keeps the gradient buffers: no fresh pages
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.mean(times)  # as dtrain-bench: tokens/s from the mean step
    tokens_per_s = c["batch"] * c["seq"] / step_s
    peak = gemm_peak_gflops(var["linear"])
    mfu = tokens_per_s * flops_per_token(c) / (peak * 1e9)
    print(f"config: {c['name']}")
    print(f"variant: {args.variant}")
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


def child_env(args, variant):
    return variant_env(variant, args.threads)


def print_table(rows):
    print(f"{'variant':<26} {'step_ms':>9} {'best_ms':>9} {'tokens/s':>10} {'peak GF/s':>10} "
          f"{'MFU':>7}  note")
    for name, fig in rows:
        if fig is None:
            print(f"{name:<26} {'failed':>9}")
            continue
        print(f"{name:<26} {float(fig['step_ms']):>9.1f} {float(fig['step_ms_min']):>9.1f} "
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
    variants = [v for v in VARIANTS
                if VARIANTS[v]["auto"] or (args.allow_coretype and v in CORETYPE_VARIANTS)]
    rows = []
    if args.variant == "auto":
        print(f"# sweep: {c['name']}, {args.warmup} warm-up + {args.sweep_steps} timed steps each, "
              f"{args.threads} thread(s)")
        for v in variants:
            res = subprocess.run(child_command(args, v, args.sweep_steps), env=child_env(args, v),
                                 capture_output=True, text=True)
            fig = parse_figures(res.stdout) if res.returncode == 0 else None
            if fig is None:
                print(f"# {v} failed:\n{res.stderr[-2000:]}", file=sys.stderr)
            rows.append((v, fig))
        print_table(rows)
        ok = [(name, fig) for name, fig in rows if fig is not None]
        if not ok:
            sys.exit("every variant failed")
        # The fastest single step ranks variants: on a shared machine it is the
        # figure least disturbed by other processes.
        best = min(ok, key=lambda r: float(r[1]["step_ms_min"]))[0]
        print(f"# fastest: {best}; timing it for {args.steps} steps")
    else:
        best = args.variant
    res = subprocess.run(child_command(args, best, args.steps), env=child_env(args, best),
                         capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"variant {best} failed:\n{res.stderr[-4000:]}")
    fig = parse_figures(res.stdout)
    print_table([(best, fig)])
    print("# command: " + " ".join(["bench/pytorch_train.py", "--config", args.config, "--steps",
                                    str(args.steps), "--variant", best]))
    sys.stdout.write(res.stdout)


if __name__ == "__main__":
    main()
