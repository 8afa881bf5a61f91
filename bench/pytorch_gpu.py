#!/usr/bin/python3
"""PyTorch on a GPU: the peer of `dtrain-bench train --set device=cuda`. The
same pre-LN Transformers as the CPU baseline (bench/pytorch_models.py, the
models of examples/configs/{lm-small,cls-seed}.json), fp32 (true fp32: TF32
off, as dtrain's fp32) or bf16 autocast over f32 weights (dtrain's bf16:
16-bit products, f32 master weights), fused AdamW, gradient clipping; eager,
or torch.compile. One process per run.

  python3 bench/pytorch_gpu.py --config lm-small --precision bf16 --steps 30 [--mode compile]

tokens/s from the mean step (as dtrain-bench), each step timed from its batch
to its optimizer step with the GPU synchronised at both ends. The last lines
are `name: value` pairs.
"""
import argparse
import statistics
import time

from pytorch_models import build_model, load_config, make_batch


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="lm-small", help="lm-small | cls-seed | path to a dtrain JSON config")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compile: its compilation)")
    p.add_argument("--device", default="cuda")
    return p.parse_args()


def main():
    import torch
    args = parse_args()
    c = load_config(args.config)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_model(c, "torch").to(device)
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": c["wd"]}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=c["lr"], fused=device.type == "cuda")
    step_fn = torch.compile(model) if args.mode == "compile" else model
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gen = torch.Generator().manual_seed(1)
    times = []
    for step in range(args.warmup + args.steps):
        tokens, targets = make_batch(c, gen)
        sync()
        t0 = time.perf_counter()
        tokens, targets = tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = step_fn(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()
        opt.zero_grad(set_to_none=False)
        sync()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    step_s = statistics.mean(times)
    print(f"config: {c['name']}")
    print(f"torch: {torch.__version__}")
    print(f"device: {torch.cuda.get_device_name() if device.type == 'cuda' else device.type}")
    print(f"precision: {args.precision}")
    print(f"mode: {args.mode}")
    print(f"steps: {args.steps}")
    print(f"final_loss: {loss.item():.4f}")
    print(f"step_ms: {step_s * 1e3:.3f}")
    print(f"tokens_per_s: {c['batch'] * c['seq'] / step_s:.1f}")


if __name__ == "__main__":
    main()
