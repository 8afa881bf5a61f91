#!/usr/bin/python3
"""PyTorch DistributedDataParallel baseline for dtrain's data-parallel engine:
the models of bench/pytorch_train.py (dtrain's example configs), 2 ranks x 1
CPU thread, gloo over loopback, at PyTorch DDP's best settings on this machine.

  bench/pytorch_ddp.py --config lm-small --steps 10
  bench/pytorch_ddp.py --config cls-seed --variants openblas-keepmem --buckets 25
  .venv-torch/bin/python bench/pytorch_ddp.py --config lm-small --variants compile-keepmem

Runs under Debian's python3-torch 1.13 (/usr/bin/python3) or PyPI's torch 2.x
(scripts/setup-torch.sh); a compile variant runs torch.compile(DDP(model)), so
that dynamo splits the graph at DDP's bucket boundaries.

Sweeps variant (BLAS library, nn.Linear engine, malloc policy), bucket_cap_mb
and gradient_as_bucket_view: --sweep staged (default) times the variants at
the middle bucket size, then every bucket x view on the fastest variant;
--sweep full every combination. Each setting is its own job of fresh
processes and process group (variant environments are fixed at process
start), started as torch.distributed.run's static rendezvous would: RANK,
WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT. Prints the table, then
times the fastest setting for --steps; the last lines are `name: value` pairs
for scripts (bench/compare-ddp.sh).

Each rank trains its own micro-batch of train.micro_batch_size sequences (as
a dtrain rank does), so one step processes ranks x batch x seq tokens. A
step's time is the slowest rank's; tokens_per_s uses the mean step and counts
all ranks, tokens_per_s_best the fastest step (as bench/pytorch_train.py).
scaling_efficiency = tokens_per_s / (ranks x --single-tokens-per-s).
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
from pathlib import Path

from pytorch_models import (VARIANTS, blas_library, candidates, compile_model, interpreter,
                            links_system_blas, load_config, make_optimizer, parse_figures,
                            prepare_model, timed_steps, variant_env, warmup_steps)

# The fastest variants of bench/pytorch_train.py --allow-coretype here
# (cls-seed: mkldnn-linear-keepmem-jit; lm-small: openblas-avx512-keepmem);
# bench/compare-ddp.sh passes the two fastest of its own single-process sweep.
# Under PyPI's torch the default is the first two eager candidates.
DEFAULT_VARIANTS = "mkldnn-linear-keepmem-jit,openblas-avx512-keepmem"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="lm-small",
                   help="lm-small | cls-seed | path to a dtrain JSON config")
    p.add_argument("--steps", type=int, default=10, help="timed steps of the fastest setting")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--sweep-steps", type=int, default=3, help="timed steps per setting in the sweep")
    p.add_argument("--variants", default="",
                   help=f"comma-separated, of: {', '.join(VARIANTS)} (Debian's torch: "
                        f"{DEFAULT_VARIANTS}; PyPI's: its first two eager variants)")
    p.add_argument("--buckets", default="1,25,100", help="bucket_cap_mb values to sweep")
    p.add_argument("--bucket-views", default="0,1",
                   help="gradient_as_bucket_view values to sweep (0, 1)")
    p.add_argument("--sweep", choices=["staged", "full"], default="staged",
                   help="staged: variants first, then buckets x views on the fastest")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--timeout-s", type=int, default=600, help="per job")
    p.add_argument("--single-tokens-per-s", type=float, default=0.0,
                   help="one process's tokens/s (bench/pytorch_train.py), for scaling_efficiency")
    p.add_argument("--bucket-mb", type=float, help=argparse.SUPPRESS)   # child: this setting
    p.add_argument("--bucket-view", type=int, help=argparse.SUPPRESS)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args()


# ---------------------------------------------------------------- one rank
def run_rank(args, c):
    """Trains one rank (started by this script's own launcher with RANK,
    WORLD_SIZE and MASTER_* set); rank 0 prints the figures."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    var = VARIANTS[args.variants]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = prepare_model(c, var, args.threads)  # DDP wraps the scripted module
    model = DDP(model, bucket_cap_mb=args.bucket_mb, gradient_as_bucket_view=bool(args.bucket_view))
    opt = make_optimizer(model, c)
    model = compile_model(model, var)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own batches
    times, loss = timed_steps(model, opt, c, gen, warmup_steps(var, args.warmup), args.steps)
    # A step ends when the slowest rank's does.
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    loss_sum = loss.detach().clone()
    dist.all_reduce(loss_sum)
    dist.destroy_process_group()
    if rank == 0:
        print_rank_figures(args, c, slowest.tolist(), world, loss_sum.item() / world)
    # Out without the interpreter's teardown: PyPI's torch 2.15 has aborted a
    # rank there ("terminate called without an active exception") after the
    # run was complete, which failed the whole peer.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def print_rank_figures(args, c, times, world, loss):
    import torch
    step_s = statistics.mean(times)
    per_step = world * c["batch"] * c["seq"]
    print(f"config: {c['name']}")
    print(f"variant: {args.variants}")
    print(f"torch: {torch.__version__}")
    print(f"mode: {'compile' if VARIANTS[args.variants]['compile'] else 'eager'}")
    print(f"bucket_cap_mb: {args.bucket_mb:g}")
    print(f"gradient_as_bucket_view: {args.bucket_view}")
    print(f"blas: {blas_library()}")
    print(f"world_size: {world}")
    print(f"threads_per_rank: {args.threads}")
    print(f"steps: {args.steps}")
    print(f"final_loss: {loss:.4f}")
    print(f"step_ms: {step_s * 1e3:.1f}")
    print(f"step_ms_median: {statistics.median(times) * 1e3:.1f}")
    print(f"step_ms_min: {min(times) * 1e3:.1f}")
    print(f"tokens_per_s: {per_step / step_s:.1f}")
    print(f"tokens_per_s_per_rank: {per_step / step_s / world:.1f}")
    print(f"tokens_per_s_best: {per_step / min(times):.1f}")


# ---------------------------------------------------------------- the sweep
def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args, setting, steps):
    """Runs one setting (variant, bucket_mb, view) as a job of args.ranks processes;
    returns (rank 0's figures, None), or (None, why) when the job failed."""
    name, bucket_mb, view = setting
    cmd = [sys.executable, str(Path(__file__).resolve()), "--config", args.config,
           "--variants", name, "--bucket-mb", str(bucket_mb), "--bucket-view", str(view),
           "--steps", str(steps), "--warmup", str(args.warmup), "--threads", str(args.threads),
           "--child"]
    env = variant_env(name, args.threads)
    # What torch.distributed.run's static rendezvous sets; its launcher itself
    # fails in Debian's torch 1.13 under Python 3.11 (Std flag parsing).
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(args.ranks), LOCAL_WORLD_SIZE=str(args.ranks),
               GLOO_SOCKET_IFNAME="lo",    # loopback only
               OMP_WAIT_POLICY="PASSIVE")  # ranks share the cores: no spinning pools
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(args.ranks)]
    outputs, failed, why = [], False, ""
    for p in procs:
        try:
            outputs.append(p.communicate(timeout=args.timeout_s))
        except subprocess.TimeoutExpired:
            outputs.append(("", f"rank {len(outputs)} timed out after {args.timeout_s} s"))
        if p.returncode != 0 and not why:
            lines = outputs[-1][1].strip().splitlines() or [f"exit status {p.returncode}"]
            why = f"rank {len(outputs) - 1}: {lines[-1][:200]}"
        failed = failed or p.returncode != 0
        if failed:  # a rank that waits for a dead peer would only time out
            for q in procs:
                if q.poll() is None:
                    q.kill()
    if failed:
        err = "\n".join(f"[rank {r}] {e[-2000:]}" for r, (_, e) in enumerate(outputs) if e)
        print(f"# {name} bucket {bucket_mb:g} view {view} failed:\n{err}", file=sys.stderr)
        return None, why
    return parse_figures(outputs[0][0]), None


def print_table(rows):
    print(f"{'variant':<30} {'bucket_mb':>9} {'as_view':>7} {'step_ms':>9} {'best_ms':>9} "
          f"{'tokens/s':>10} {'per rank':>10}")
    for (name, bucket_mb, view), fig in rows:
        head = f"{name:<30} {bucket_mb:>9g} {view:>7}"
        if fig is None:
            print(f"{head} {'failed':>9}")
            continue
        print(f"{head} {float(fig['step_ms']):>9.1f} {float(fig['step_ms_min']):>9.1f} "
              f"{float(fig['tokens_per_s']):>10.1f} {float(fig['tokens_per_s_per_rank']):>10.1f}")
    sys.stdout.flush()


def sweep_axes(args):
    names = args.variants or (DEFAULT_VARIANTS if links_system_blas()
                              else ",".join(candidates("eager")[:2]))
    variants = [v.strip() for v in names.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        sys.exit(f"unknown variant(s) {', '.join(unknown)}; one of: {', '.join(VARIANTS)}")
    buckets = [float(b) for b in args.buckets.split(",")]
    views = [int(v) for v in args.bucket_views.split(",")]
    return variants, buckets, views


def time_settings(args, settings, done, why):
    """Times each setting not in `done` (setting -> figures, None when it failed,
    with the reason in `why`) and adds it there."""
    for s in settings:
        if s not in done:
            done[s], reason = launch(args, s, args.sweep_steps)
            if reason:
                why[s] = reason


def ranked(done, why):
    """The settings that ran, fastest first."""
    ok = [(s, fig) for s, fig in done.items() if fig is not None]
    if not ok:
        sys.exit("failed: every setting failed; " +
                 "; ".join(f"{s[0]} bucket {s[1]:g} view {s[2]}: {r}" for s, r in why.items()))
    # As bench/pytorch_train.py: the fastest step ranks the settings, the
    # figure least disturbed by other processes on a shared machine.
    return [s for s, _ in sorted(ok, key=lambda r: float(r[1]["step_ms_min"]))]


def fastest(done, why):
    return ranked(done, why)[0]


def sweep(args, c):
    """The settings that ran, fastest first. full: every variant x bucket x
    view. staged: the variants at the middle bucket size (views as given),
    then the fastest variant at every bucket x view: a third of full's jobs
    for 2 variants."""
    variants, buckets, views = sweep_axes(args)
    if len(variants) * len(buckets) * len(views) == 1:
        return [(variants[0], buckets[0], views[0])]
    print(f"# sweep ({args.sweep}): {c['name']}, {args.ranks} ranks x {args.threads} thread(s), "
          f"gloo, {args.warmup} warm-up + {args.sweep_steps} timed steps each")
    sys.stdout.flush()
    done, why = {}, {}
    if args.sweep == "staged":
        middle = buckets[len(buckets) // 2]
        time_settings(args, [(v, middle, views[-1]) for v in variants], done, why)
        variants = [fastest(done, why)[0]]
    time_settings(args, [(v, b, w) for v in variants for b in buckets for w in views], done, why)
    print_table(list(done.items()))
    order = ranked(done, why)
    best = order[0]
    print(f"# fastest: {best[0]} bucket_cap_mb {best[1]:g} gradient_as_bucket_view {best[2]}; "
          f"timing it for {args.steps} steps")
    return order


def main():
    args = parse_args()
    c = load_config(args.config)
    if args.child:
        run_rank(args, c)
        return
    # A timed run that fails (PyTorch 2.x has been seen to abort a rank on its
    # way out) falls back to the next fastest setting of the sweep.
    failures = []
    for best in sweep(args, c):
        fig, why = launch(args, best, args.steps)
        if fig is not None:
            break
        failures.append(f"setting {best[0]} bucket {best[1]:g} view {best[2]}: {why}")
        print(f"# timed run failed, {failures[-1]}; trying the next fastest setting", file=sys.stderr)
    else:
        sys.exit("failed: " + "; ".join(failures))
    print_table([(best, fig)])
    print(f"# command: {interpreter()} bench/pytorch_ddp.py --config {args.config} "
          f"--steps {args.steps} "
          f"--variants {best[0]} --buckets {best[1]:g} --bucket-views {best[2]}")
    for key, value in fig.items():
        print(f"{key}: {value}")
    print(f"variant_best: {best[0]}")
    if args.single_tokens_per_s > 0:
        eff = float(fig["tokens_per_s"]) / (args.ranks * args.single_tokens_per_s)
        print(f"single_tokens_per_s: {args.single_tokens_per_s:.1f}")
        print(f"scaling_efficiency: {eff:.3f}")


if __name__ == "__main__":
    main()
