"""An independent PyTorch reference of dtrain's decoder-only language model and
its training step, for tests/integration/test_reference_pytorch.cpp.

Written from the published definitions, not from dtrain's kernels: GPT-2
(pre-LN blocks, learned positions, LayerNorm, GELU, biases) and LLaMA (RMSNorm,
rotary positions in Hugging Face's rotate-half layout, SwiGLU, grouped-query
attention, no biases). It reads dtrain's names and shapes from a safetensors
file (`dtrain-ckpt export`'s format), the run's resolved config.json and its
llm.c token shard, trains with torch.optim.AdamW, and prints one JSON line per
step: {"step", "loss", "grad_norm", "lr"}. With --final it compares its last
parameters with a safetensors export of the run's last step and prints
{"event": "final", ...}.

What it shares with dtrain is the contract only:
- parameters per layer l ("layer.l."): ln1.weight, ln1.bias (layernorm);
  qkv.weight [(H + 2 Hkv) hd, d] (query heads, then key heads, then value
  heads), qkv.bias; proj.weight [d, d], proj.bias; ln2.*; fc1.weight [d_ff, d]
  (swiglu: [2 d_ff, d], the gate's rows first), fc1.bias; fc2.weight [d, d_ff],
  fc2.bias; tok_emb [V, d], pos_emb [max_seq, d] (learned); lnf.*, head.weight
  [V, d] (untied). Biases only with model.bias.
- data: window k of the stream is tokens [k T, k T + T]; sample s of an
  unshuffled run reads window s mod n; a step's micro-batch m holds samples
  (step * accum + m) * B ... + B - 1 (one rank).
- optimizer: AdamW with weight decay on matrices and embeddings only; the
  gradient of a step is the mean over its micro-batches, clipped by global
  L2 norm (torch's clip_grad_norm_); the learning rate of 0-based step s is
  linear warmup ((s + 1) / warmup * lr), then constant, linear or cosine decay
  to lr * min_lr_ratio at train.steps.

Runs with PyTorch 1.13 (no scaled_dot_product_attention: attention is written
out) and NumPy; exits 2 with a message on an input it cannot reproduce.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

TOKEN_SHARD_MAGIC = 20240520  # llm.c's .bin: int32[256] header, then uint16 tokens
TOKEN_SHARD_HEADER_BYTES = 1024


class Refused(Exception):
    """An input this reference does not reproduce; the message says which."""


# ---- inputs ------------------------------------------------------------------


def read_safetensors(path):
    """{name: float32 array} and the metadata of a safetensors file (F32 only)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    body = data[8 + n:]
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise Refused(f"{path}: tensor {name} is {t['dtype']}, not F32")
        begin, end = t["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype="<f4").astype(np.float32)
        tensors[name] = array.reshape(t["shape"])
    return tensors, metadata


def read_token_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    if magic != TOKEN_SHARD_MAGIC or version != 1:
        raise Refused(f"{path}: not an llm.c token shard (magic {magic}, version {version})")
    if len(data) != TOKEN_SHARD_HEADER_BYTES + 2 * count:
        raise Refused(f"{path}: {len(data)} bytes for {count} tokens")
    return np.frombuffer(data[TOKEN_SHARD_HEADER_BYTES:], dtype="<u2").astype(np.int64)


class Options:
    """The model of a resolved config.json; an absent, empty or zero field
    means its default (today's GPT-2-like block)."""

    def __init__(self, model):
        if model.get("kind", "lm") != "lm" or model.get("input", "tokens") not in ("", "tokens"):
            raise Refused("model.kind must be lm with token inputs")
        if model.get("dropout", 0) != 0:
            raise Refused(f"model.dropout is {model['dropout']}; the reference trains without dropout")
        self.vocab = int(model["vocab_size"])
        self.d = int(model["d_model"])
        self.heads = int(model["n_heads"])
        self.kv_heads = int(model.get("n_kv_heads") or self.heads)
        self.layers = int(model["n_layers"])
        self.d_ff = int(model["d_ff"])
        self.max_seq = int(model["max_seq_len"])
        self.tied = bool(model.get("tie_embeddings", False))
        self.norm = model.get("norm") or "layernorm"
        self.norm_eps = float(model.get("norm_eps") or 1e-5)
        self.position = model.get("position") or "learned"
        self.rope_theta = float(model.get("rope_theta") or 10000.0)
        self.mlp = model.get("mlp") or "gelu"
        self.bias = model.get("bias") is not False  # null (unset) or absent: biases, as today
        self.head_dim = self.d // self.heads
        for field, value, allowed in (("norm", self.norm, ("layernorm", "rmsnorm")),
                                      ("position", self.position, ("learned", "rope")),
                                      ("mlp", self.mlp, ("gelu", "gelu_tanh", "swiglu"))):
            if value not in allowed:
                raise Refused(f"model.{field} is {value!r}; the reference knows {allowed}")
        if self.d % self.heads != 0 or self.heads % self.kv_heads != 0:
            raise Refused(f"d_model {self.d}, n_heads {self.heads}, n_kv_heads {self.kv_heads} do not divide")

    def shapes(self):
        """Every parameter's name and shape, as dtrain names them."""
        d, ff, hd = self.d, self.d_ff, self.head_dim
        layernorm = self.norm == "layernorm"
        out = {"tok_emb": [self.vocab, d]}
        if self.position == "learned":
            out["pos_emb"] = [self.max_seq, d]
        qkv_rows = (self.heads + 2 * self.kv_heads) * hd
        fc1_rows = 2 * ff if self.mlp == "swiglu" else ff
        for l in range(self.layers):
            p = f"layer.{l}."
            out[p + "ln1.weight"] = [d]
            if layernorm:
                out[p + "ln1.bias"] = [d]
            out[p + "qkv.weight"] = [qkv_rows, d]
            if self.bias:
                out[p + "qkv.bias"] = [qkv_rows]
            out[p + "proj.weight"] = [d, d]
            if self.bias:
                out[p + "proj.bias"] = [d]
            out[p + "ln2.weight"] = [d]
            if layernorm:
                out[p + "ln2.bias"] = [d]
            out[p + "fc1.weight"] = [fc1_rows, d]
            if self.bias:
                out[p + "fc1.bias"] = [fc1_rows]
            out[p + "fc2.weight"] = [d, ff]
            if self.bias:
                out[p + "fc2.bias"] = [d]
        out["lnf.weight"] = [d]
        if layernorm:
            out["lnf.bias"] = [d]
        if not self.tied:
            out["head.weight"] = [self.vocab, d]
        return out


def check_names(tensors, options, path):
    want = options.shapes()
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise Refused(f"{path}: the model's parameters differ from the reference's: missing {missing}, "
                      f"unexpected {extra}")
    for name, shape in want.items():
        if list(tensors[name].shape) != shape:
            raise Refused(f"{path}: {name} has shape {list(tensors[name].shape)}, the reference expects {shape}")


# ---- the model ---------------------------------------------------------------


def norm(x, p, prefix, o):
    if o.norm == "layernorm":
        return F.layer_norm(x, (o.d,), p[prefix + ".weight"], p[prefix + ".bias"], o.norm_eps)
    # RMSNorm (LLaMA): x / sqrt(mean(x^2) + eps) * w.
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + o.norm_eps) * p[prefix + ".weight"]


def linear(x, p, prefix, o):
    return F.linear(x, p[prefix + ".weight"], p[prefix + ".bias"] if o.bias else None)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotary(x, o):
    """Hugging Face LLaMA's rotary embedding of x [B, heads, T, hd] at positions 0..T-1."""
    hd, T = o.head_dim, x.shape[2]
    inv_freq = 1.0 / (o.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    return x * cos + rotate_half(x) * sin


def attention(x, p, prefix, o):
    B, T, _ = x.shape
    H, Hkv, hd = o.heads, o.kv_heads, o.head_dim
    qkv = linear(x, p, prefix + "qkv", o)
    q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, Hkv, hd).transpose(1, 2)
    v = v.view(B, T, Hkv, hd).transpose(1, 2)
    if o.position == "rope":
        q, k = rotary(q, o), rotary(k, o)
    if Hkv != H:  # query head h reads key/value head h // (H / Hkv)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    scores = scores.masked_fill(causal, float("-inf"))
    y = torch.softmax(scores, dim=-1) @ v
    return linear(y.transpose(1, 2).reshape(B, T, H * hd), p, prefix + "proj", o)


def mlp(x, p, prefix, o):
    h = linear(x, p, prefix + "fc1", o)
    if o.mlp == "swiglu":
        gate, up = h.split([o.d_ff, o.d_ff], dim=-1)
        a = F.silu(gate) * up
    else:
        a = F.gelu(h, approximate="tanh" if o.mlp == "gelu_tanh" else "none")
    return linear(a, p, prefix + "fc2", o)


def loss_of(p, tokens, targets, o):
    T = tokens.shape[1]
    x = F.embedding(tokens, p["tok_emb"])
    if o.position == "learned":
        x = x + p["pos_emb"][:T]
    for l in range(o.layers):
        prefix = f"layer.{l}."
        x = x + attention(norm(x, p, prefix + "ln1", o), p, prefix, o)
        x = x + mlp(norm(x, p, prefix + "ln2", o), p, prefix, o)
    x = norm(x, p, "lnf", o)
    logits = F.linear(x, p["tok_emb"] if o.tied else p["head.weight"])
    return F.cross_entropy(logits.reshape(-1, o.vocab), targets.reshape(-1))


# ---- training ----------------------------------------------------------------


def lr_at(step, config):
    opt, sched, steps = config["optimizer"], config["schedule"], int(config["train"]["steps"])
    lr = float(opt["lr"])
    warmup = int(sched.get("warmup_steps", 0))
    if step < warmup:
        return lr * (step + 1) / warmup
    min_lr = lr * float(sched.get("min_lr_ratio", 0.1))
    span = steps - warmup
    progress = min(1.0, (step - warmup) / span if span > 0 else 1.0)
    decay = sched.get("decay") or "cosine"
    if decay == "constant":
        return lr
    if decay == "linear":
        return lr - (lr - min_lr) * progress
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)


def check_run(config):
    data = config["data"]
    if data.get("kind") != "tokens":
        raise Refused(f"data.kind is {data.get('kind')!r}; the reference reads one token shard (\"tokens\")")
    if data.get("shuffle", True):
        raise Refused("data.shuffle is on; the reference reads the windows in order (set it to false)")
    if not os.path.isfile(data["path"]):
        raise Refused(f"data.path {data['path']!r} is not one file")
    if config.get("precision", "fp32") != "fp32":
        raise Refused(f"precision is {config['precision']!r}; the reference is fp32")


def train(config, init, steps, dtype):
    o = Options(config["model"])
    check_run(config)
    stream = read_token_shard(config["data"]["path"])
    T = int(config["data"]["seq_len"])
    B = int(config["train"]["micro_batch_size"])
    accum = int(config["train"].get("grad_accum_steps", 1))
    windows = (len(stream) - 1) // T
    if windows < 1:
        raise Refused(f"{config['data']['path']}: no window of {T + 1} tokens")

    params = {n: torch.tensor(a, dtype=dtype, requires_grad=True) for n, a in init.items()}
    names = list(o.shapes())  # a fixed order for the optimizer and the norm
    opt = config["optimizer"]
    # Weight decay on matrices and embeddings, none on norms and biases.
    groups = [{"params": [params[n] for n in names if params[n].dim() >= 2],
               "weight_decay": float(opt["weight_decay"])},
              {"params": [params[n] for n in names if params[n].dim() < 2], "weight_decay": 0.0}]
    adamw = torch.optim.AdamW(groups, lr=float(opt["lr"]), betas=(float(opt["beta1"]), float(opt["beta2"])),
                              eps=float(opt["eps"]), foreach=False)
    max_norm = float(opt.get("grad_clip", 0.0))

    for step in range(steps):
        adamw.zero_grad(set_to_none=False)
        losses = []
        for micro in range(accum):
            first = (step * accum + micro) * B
            rows = [stream[(s % windows) * T:(s % windows) * T + T + 1] for s in range(first, first + B)]
            batch = torch.from_numpy(np.stack(rows))
            loss = loss_of(params, batch[:, :-1], batch[:, 1:], o)
            (loss / accum).backward()
            losses.append(loss.item())
        grads = [params[n].grad for n in names]
        if max_norm > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_([params[n] for n in names], max_norm).item()
        else:
            grad_norm = torch.norm(torch.stack([torch.norm(g, 2) for g in grads]), 2).item()
        lr = lr_at(step, config)
        for group in adamw.param_groups:
            group["lr"] = lr
        adamw.step()
        print(json.dumps({"step": step + 1, "loss": sum(losses) / accum, "grad_norm": grad_norm, "lr": lr}),
              flush=True)
    return {n: t.detach().to(torch.float32).numpy() for n, t in params.items()}


def compare_final(final, path, options):
    theirs, _ = read_safetensors(path)
    check_names(theirs, options, path)
    worst_name, worst_abs, worst_rel = "", 0.0, 0.0
    for name, mine in final.items():
        diff = np.abs(mine.astype(np.float64) - theirs[name].astype(np.float64))
        scale = max(float(np.abs(theirs[name]).max()), 1e-30)
        if float(diff.max()) > worst_abs:
            worst_name, worst_abs = name, float(diff.max())
        worst_rel = max(worst_rel, float(diff.max()) / scale)
    print(json.dumps({"event": "final", "max_abs_diff": worst_abs, "tensor": worst_name,
                      "max_diff_over_tensor_max": worst_rel}), flush=True)


def self_check():
    """The LLaMA pieces against closed forms, in float64; raises AssertionError."""
    torch.manual_seed(0)
    model = {"kind": "lm", "vocab_size": 11, "d_model": 24, "n_heads": 4, "n_layers": 1, "d_ff": 16,
             "max_seq_len": 8, "norm": "rmsnorm", "position": "rope", "mlp": "swiglu", "bias": False}
    o = Options(model)
    hd, T = o.head_dim, 8
    # Rotary: pair (i, i + hd/2) turns by position * theta^(-2i/hd), so the
    # score of q at position a and k at position b depends on a - b only.
    q, k = torch.randn(hd, dtype=torch.float64), torch.randn(hd, dtype=torch.float64)
    rq = rotary(q.expand(1, 1, T, hd).contiguous(), o)[0, 0]
    rk = rotary(k.expand(1, 1, T, hd).contiguous(), o)[0, 0]
    scores = rq @ rk.T
    for shift in range(1, T):
        diagonal = torch.diagonal(scores, -shift)
        assert torch.allclose(diagonal, diagonal[0].expand_as(diagonal), atol=1e-5), "rotary: not relative"
    half = hd // 2
    angle = 3 * o.rope_theta ** (-2 * torch.arange(half, dtype=torch.float64) / hd)
    c, s = angle.cos(), angle.sin()
    turned = torch.cat((q[:half] * c - q[half:] * s, q[half:] * c + q[:half] * s))
    assert torch.allclose(rq[3], turned, atol=1e-5), "rotary: not the rotate-half layout"
    # Grouped-query attention equals multi-head attention whose key/value
    # heads are copies: query head h reads key/value head h // (H / Hkv).
    for kv in (2, 1):
        gqa = Options(dict(model, n_kv_heads=kv))
        p = {"qkv.weight": torch.randn((o.heads + 2 * kv) * hd, o.d, dtype=torch.float64),
             "proj.weight": torch.randn(o.d, o.d, dtype=torch.float64)}
        wq, wk, wv = p["qkv.weight"].split([o.heads * hd, kv * hd, kv * hd])
        copy = lambda w: torch.cat([w.view(kv, hd, o.d)[h // (o.heads // kv)] for h in range(o.heads)])
        mha = {"qkv.weight": torch.cat((wq, copy(wk), copy(wv))), "proj.weight": p["proj.weight"]}
        x = torch.randn(2, T, o.d, dtype=torch.float64)
        assert torch.allclose(attention(x, p, "", gqa), attention(x, mha, "", o)), f"n_kv_heads {kv}"
    # Causality: a later token does not change an earlier position's output.
    x = torch.randn(1, T, o.d, dtype=torch.float64)
    p = {"qkv.weight": torch.randn(3 * o.d, o.d, dtype=torch.float64),
         "proj.weight": torch.randn(o.d, o.d, dtype=torch.float64)}
    y = attention(x, p, "", o)
    x[0, -1] += 1.0
    assert torch.allclose(attention(x, p, "", o)[0, :-1], y[0, :-1]), "attention: not causal"
    # RMSNorm and SwiGLU by their formulas.
    w = torch.randn(o.d, dtype=torch.float64)
    assert torch.allclose(norm(x, {"n.weight": w}, "n", o), x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt() * w)
    fc1, fc2 = torch.randn(2 * o.d_ff, o.d, dtype=torch.float64), torch.randn(o.d, o.d_ff, dtype=torch.float64)
    gate, up = x @ fc1[:o.d_ff].T, x @ fc1[o.d_ff:].T
    expected = (gate / (1 + torch.exp(-gate)) * up) @ fc2.T
    assert torch.allclose(mlp(x, {"fc1.weight": fc1, "fc2.weight": fc2}, "", o), expected), "swiglu"
    tanh = Options(dict(model, mlp="gelu_tanh"))
    h = torch.randn(100, dtype=torch.float64) * 3
    closed = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    assert torch.allclose(F.gelu(h, approximate="tanh"), closed) and tanh.mlp == "gelu_tanh", "gelu_tanh"
    print(json.dumps({"event": "self_check", "ok": True}), flush=True)


def main():
    if sys.argv[1:] == ["--self-check"]:
        torch.set_num_threads(1)
        self_check()
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the run's resolved config.json")
    parser.add_argument("--init", required=True, help="the initial parameters (safetensors, dtrain's names)")
    parser.add_argument("--steps", type=int, help="steps to train (default train.steps)")
    parser.add_argument("--final", help="safetensors of the run's last step to compare the result with")
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = parser.parse_args()
    torch.set_num_threads(1)
    try:
        with open(args.config) as f:
            config = json.load(f)
        options = Options(config["model"])
        init, _ = read_safetensors(args.init)
        check_names(init, options, args.init)
        steps = args.steps if args.steps is not None else int(config["train"]["steps"])
        final = train(config, init, steps, getattr(torch, args.dtype))
        if args.final:
            compare_final(final, args.final, options)
    except (Refused, KeyError, OSError) as e:
        what = f"missing config field {e}" if isinstance(e, KeyError) else str(e)
        print(f"reference_lm.py: {what}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
