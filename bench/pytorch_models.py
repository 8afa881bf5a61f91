"""Shared by bench/pytorch_train.py (one process) and bench/pytorch_ddp.py
(DistributedDataParallel): the PyTorch twins of dtrain's example models
(pre-LN Transformers read from examples/configs/*.json), their optimizer,
batches and timed training loop, and the table of fp32 variants (BLAS
library, nn.Linear engine, malloc policy, torch.compile), each fixed at
process start by its environment.

The same code runs under Debian's python3-torch 1.13 and PyPI's torch 2.x
(scripts/setup-torch.sh): which variants apply depends on the interpreter
(`candidates`). Debian's torch calls the system's libblas.so.3, so a variant
picks the BLAS library with LD_LIBRARY_PATH; PyPI's torch carries its own
(MKL, linked in), and only it has torch.compile.
"""
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
# Debian's libopenblas0-pthread (scripts/setup.sh --bench); OPENBLAS_DIR names
# another folder holding its libblas.so.3 (the package unpacked without root).
OPENBLAS_DIR = Path(os.environ.get("OPENBLAS_DIR", LIBDIR / "openblas-pthread"))
REFBLAS_DIR = LIBDIR / "blas"                # Debian libblas3 (reference BLAS)
# glibc keeps freed blocks (< 32 MiB) in its heap instead of unmapping them, so
# PyTorch's per-step activations do not pay first-touch page faults every step.
GLIBC_KEEP = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296"

OPENBLAS = {"LD_LIBRARY_PATH": str(OPENBLAS_DIR)}
KEEPMEM = {"LD_LIBRARY_PATH": str(OPENBLAS_DIR), "GLIBC_TUNABLES": GLIBC_KEEP}
# This environment pins OPENBLAS_CORETYPE=Haswell (AVX2 kernels, ~100 GFLOP/s on
# one thread); OpenBLAS's own AVX-512 kernels run ~200. Variants that override
# the pin are opt-in (--allow-coretype): the pin is part of the platform.
KEEPMEM_AVX512 = dict(KEEPMEM, OPENBLAS_CORETYPE="SkylakeX")


def variant(env, linear="torch", jit=False, mkldnn=True, note="", auto=True, blas="system",
            compile=False):
    """env: process environment; linear: nn.Linear's engine ("torch" = BLAS sgemm,
    "mkldnn" = oneDNN inner product); jit: torch.jit.script (CPU fuser where LLVM is built in);
    mkldnn: torch.backends.mkldnn.enabled; auto: part of --variant auto; blas: "system" for a
    torch that calls the system's BLAS (Debian's), "bundled" for one that carries its own
    (PyPI's); compile: torch.compile (inductor, C++ on CPU). All fp32."""
    return {"env": env, "linear": linear, "jit": jit, "mkldnn": mkldnn, "note": note,
            "auto": auto, "blas": blas, "compile": compile}


VARIANTS = {
    "openblas": variant(OPENBLAS, note="eager; Linear, bmm -> OpenBLAS sgemm"),
    "openblas-keepmem": variant(KEEPMEM, note="as openblas; malloc keeps freed memory"),
    "openblas-keepmem-jit": variant(KEEPMEM, jit=True, note="as openblas-keepmem; jit.script"),
    "openblas-keepmem-nomkldnn": variant(KEEPMEM, mkldnn=False,
                                         note="as openblas-keepmem; backends.mkldnn off"),
    "mkldnn-linear": variant(OPENBLAS, linear="mkldnn",
                             note="Linear -> oneDNN inner product; bmm -> OpenBLAS"),
    "mkldnn-linear-keepmem": variant(KEEPMEM, linear="mkldnn",
                                     note="as mkldnn-linear; malloc keeps freed memory"),
    "mkldnn-linear-keepmem-jit": variant(KEEPMEM, linear="mkldnn", jit=True,
                                         note="as mkldnn-linear-keepmem; jit.script"),
    "openblas-avx512-keepmem": variant(KEEPMEM_AVX512, auto=False,
                                       note="as openblas-keepmem; OPENBLAS_CORETYPE=SkylakeX"),
    "mkldnn-linear-avx512-keepmem": variant(KEEPMEM_AVX512, linear="mkldnn", auto=False,
                                            note="as mkldnn-linear-keepmem; CORETYPE=SkylakeX"),
    # Reference BLAS: what python3-torch gets without libopenblas0. Slow; never in auto.
    "refblas": variant({"LD_LIBRARY_PATH": str(REFBLAS_DIR)}, auto=False,
                       note="eager; reference BLAS"),
    # PyPI's torch: BLAS is its own MKL whatever LD_LIBRARY_PATH says.
    "bundled": variant({}, blas="bundled", note="eager; Linear, bmm -> torch's own BLAS (MKL)"),
    "bundled-keepmem": variant({"GLIBC_TUNABLES": GLIBC_KEEP}, blas="bundled",
                               note="as bundled; malloc keeps freed memory"),
    "mkldnn-linear-bundled-keepmem": variant({"GLIBC_TUNABLES": GLIBC_KEEP}, linear="mkldnn",
                                             blas="bundled",
                                             note="as bundled-keepmem; Linear -> oneDNN"),
    # One inductor worker: no compile pool beside the rank's one thread.
    "compile-keepmem": variant({"GLIBC_TUNABLES": GLIBC_KEEP, "TORCHINDUCTOR_COMPILE_THREADS": "1"},
                               blas="bundled", compile=True,
                               note="torch.compile (inductor); malloc keeps freed memory"),
}
CORETYPE_VARIANTS = [v for v in VARIANTS if "OPENBLAS_CORETYPE" in VARIANTS[v]["env"]]


def interpreter():
    """This Python as a command: relative to the repository when it lives there
    (.venv-torch/bin/python), else its path (/usr/bin/python3)."""
    exe = Path(sys.executable).absolute()
    return str(exe.relative_to(REPO)) if REPO in exe.parents else str(exe)


def links_system_blas():
    """Whether this interpreter's torch calls the system's libblas.so.3 (Debian's)."""
    __import__("torch")  # loads its libraries, the BLAS among them
    return not blas_library().startswith("linked-in/")


def candidates(mode, allow_coretype=False):
    """The variants --variant auto sweeps under this interpreter: mode "eager"
    (no torch.compile; TorchScript counts as eager) or "compile"."""
    blas = "system" if links_system_blas() else "bundled"
    return [v for v, var in VARIANTS.items()
            if var["blas"] == blas and var["compile"] == (mode == "compile")
            and (var["auto"] or (allow_coretype and v in CORETYPE_VARIANTS))]


def variant_env(name, threads):
    """The environment a process of variant `name` starts with, on `threads` threads."""
    env = dict(os.environ)
    env.update(VARIANTS[name]["env"])
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    return env


def load_config(name):
    path = Path(name) if name.endswith(".json") else REPO / "examples" / "configs" / f"{name}.json"
    with open(path) as f:
        cfg = json.load(f)
    m, opt = cfg["model"], cfg["optimizer"]
    return {
        "name": path.stem, "kind": m["kind"], "vocab": m["vocab_size"], "d": m["d_model"],
        "heads": m["n_heads"], "layers": m["n_layers"], "d_ff": m["d_ff"],
        "seq": cfg["data"]["seq_len"], "batch": cfg["train"]["micro_batch_size"],
        "classes": m.get("num_classes", 0), "lr": opt["lr"], "wd": opt["weight_decay"],
        "clip": opt.get("grad_clip", 1.0),
        # The block (dtrain's model.* options; their defaults are GPT-2-like).
        "norm": m.get("norm", "layernorm"), "eps": m.get("norm_eps", 1e-5),
        "position": m.get("position", "learned"), "theta": m.get("rope_theta", 10000.0),
        "mlp": m.get("mlp", "gelu"), "kv_heads": m.get("n_kv_heads", m["n_heads"]),
        "bias": m.get("bias", True), "tied": m.get("tie_embeddings", False),
    }


def flops_per_token(c):
    d, L, hd = c["d"], c["layers"], c["d"] // c["heads"]
    qkv = (c["heads"] + 2 * c["kv_heads"]) * hd
    fc1 = 2 * c["d_ff"] if c["mlp"] == "swiglu" else c["d_ff"]
    n_matmul = L * (qkv * d + d * d + fc1 * d + c["d_ff"] * d)
    n_matmul += d * c["vocab"] if c["kind"] == "lm" else d * c["classes"]
    return 6 * n_matmul + 12 * L * d * c["seq"]


# ---------------------------------------------------------------- the models
def build_model(c, linear_impl):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class MkldnnLinear(nn.Linear):
        # oneDNN inner product; the weight stays a dense tensor (what
        # mkldnn_linear's backward requires), activations convert per call.
        def forward(self, x):
            shape = x.shape
            y = torch._C._nn.mkldnn_linear(x.reshape(-1, shape[-1]).to_mkldnn(),
                                           self.weight, self.bias)
            return y.to_dense().view(list(shape[:-1]) + [self.out_features])

    Linear = MkldnnLinear if linear_impl == "mkldnn" else nn.Linear

    def norm(d):
        if c["norm"] == "layernorm":
            return nn.LayerNorm(d, eps=c["eps"])
        return RMSNorm(d)

    class RMSNorm(nn.Module):  # torch 1.13 has no nn.RMSNorm
        def __init__(self, d):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["eps"]) * self.weight

    sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch 2.x: the fused kernel

    class Block(nn.Module):
        # x = x + attn(norm1(x)); x = x + mlp(norm2(x)); [B,T,d] -> [B,T,d]
        def __init__(self):
            super().__init__()
            d = c["d"]
            self.heads, self.kv, self.hd = c["heads"], c["kv_heads"], d // c["heads"]
            self.ln1, self.ln2 = norm(d), norm(d)
            self.qkv = Linear(d, (self.heads + 2 * self.kv) * self.hd, bias=c["bias"])
            self.proj = Linear(d, d, bias=c["bias"])
            self.swiglu = c["mlp"] == "swiglu"
            self.fc1 = Linear(d, (2 if self.swiglu else 1) * c["d_ff"], bias=c["bias"])
            self.fc2 = Linear(c["d_ff"], d, bias=c["bias"])
            self.approximate = "tanh" if c["mlp"] == "gelu_tanh" else "none"
            self.causal = c["kind"] == "lm"
            mask = torch.full((c["seq"], c["seq"]), float("-inf")).triu(1)
            self.register_buffer("mask", mask, persistent=False)
            self.rope = c["position"] == "rope"
            if self.rope:  # Hugging Face LLaMA's rotate-half
                inv = 1.0 / (c["theta"] ** (torch.arange(0, self.hd, 2).float() / self.hd))
                ang = torch.arange(c["seq"]).float()[:, None] * inv[None, :]
                emb = torch.cat([ang, ang], dim=-1)
                self.register_buffer("cos", emb.cos(), persistent=False)
                self.register_buffer("sin", emb.sin(), persistent=False)

        def rotate(self, x):  # [B, H, T, hd]
            half = self.hd // 2
            rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
            T = x.shape[2]
            return x * self.cos[:T] + rot * self.sin[:T]

        def forward(self, x):
            B, T, d = x.shape
            H, K, hd = self.heads, self.kv, self.hd
            qkv = self.qkv(self.ln1(x))
            q = qkv[..., : H * hd].view(B, T, H, hd).transpose(1, 2)
            k = qkv[..., H * hd:(H + K) * hd].view(B, T, K, hd).transpose(1, 2)
            v = qkv[..., (H + K) * hd:].view(B, T, K, hd).transpose(1, 2)
            if self.rope:
                q, k = self.rotate(q), self.rotate(k)
            if K != H:
                k, v = k.repeat_interleave(H // K, dim=1), v.repeat_interleave(H // K, dim=1)
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=self.causal)
            else:
                att = (q * (1.0 / math.sqrt(hd))) @ k.transpose(-2, -1)          # [B,H,T,T]
                if self.causal:
                    att = att + self.mask[:T, :T]
                y = att.softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, d))
            h = self.fc1(self.ln2(x))
            if self.swiglu:
                gate, up = h.chunk(2, dim=-1)
                a = F.silu(gate) * up
            else:
                a = F.gelu(h, approximate=self.approximate)
            return x + self.fc2(a)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            d = c["d"]
            self.tok = nn.Embedding(c["vocab"], d)
            self.learned = c["position"] == "learned"
            if self.learned:
                self.pos = nn.Parameter(torch.empty(c["seq"], d))
            self.blocks = nn.ModuleList(Block() for _ in range(c["layers"]))
            self.ln_f = norm(d)
            self.is_lm = c["kind"] == "lm"
            if self.is_lm:
                self.head = Linear(d, c["vocab"], bias=False)
                if c["tied"]:
                    self.head.weight = self.tok.weight
            else:
                self.head = Linear(d, c["classes"])

        def forward(self, tokens, targets):
            x = self.tok(tokens)
            if self.learned:
                x = x + self.pos[: tokens.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            x = self.ln_f(x)
            if self.is_lm:
                logits = self.head(x)
                return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))
            return F.cross_entropy(self.head(x.mean(dim=1)), targets)

    model = Model()
    for name, p in model.named_parameters():
        if name.startswith("ln") or ".ln" in name:
            continue  # LayerNorm keeps weight 1, bias 0
        if p.dim() >= 2:
            nn.init.normal_(p, 0.0, 0.02)
        else:
            nn.init.zeros_(p)
    return model


def prepare_model(c, var, threads):
    """The model of config c in variant var on `threads` threads, seeded as
    dtrain-independent baselines expect (seed 0), scripted for jit variants."""
    import torch
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = var["mkldnn"]
    torch.manual_seed(0)
    model = build_model(c, var["linear"])
    if var["jit"]:
        # The CPU fuser (NNC) needs LLVM, which Debian's python3-torch lacks.
        torch._C._jit_override_can_fuse_on_cpu(torch._C._llvm_enabled())
        model = torch.jit.script(model)
    return model


def compile_model(model, var):
    """torch.compile(model) for compile variants (after DDP wraps it, so that
    its graph breaks at bucket boundaries), the model itself otherwise."""
    import torch
    return torch.compile(model) if var["compile"] else model


def warmup_steps(var, warmup):
    """Untimed steps: the profiling executor optimises a scripted graph after a
    few runs; torch.compile compiles forward and backward in the first ones."""
    return max(warmup, 5) if var["jit"] else max(warmup, 3) if var["compile"] else warmup


def make_optimizer(model, c):
    import torch
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decay, "weight_decay": c["wd"]}, {"params": no_decay, "weight_decay": 0.0}]
    # foreach=True was slower here: its temporaries for all parameters at once
    # are fresh memory each step (cls-seed clip+step 588 vs 158 ms; 61 vs 52 ms
    # with GLIBC_KEEP).
    return torch.optim.AdamW(groups, lr=c["lr"], foreach=False)


def make_batch(c, gen):
    import torch
    B, T = c["batch"], c["seq"]
    if c["kind"] == "lm":
        seq = torch.randint(0, c["vocab"], (B, T + 1), generator=gen)
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    return (torch.randint(0, c["vocab"], (B, T), generator=gen),
            torch.randint(0, c["classes"], (B,), generator=gen))


def timed_steps(model, opt, c, gen, warmup, steps):
    """Trains warmup + steps steps on batches drawn from `gen`: (the seconds of
    each timed step, the last step's loss)."""
    import torch
    times = []
    for step in range(warmup + steps):
        tokens, targets = make_batch(c, gen)
        t0 = time.perf_counter()
        loss = model(tokens, targets)
        loss.backward()   # under DDP: all-reduces (averages) gradient buckets as they become ready
        torch.nn.utils.clip_grad_norm_(model.parameters(), c["clip"])
        opt.step()
        # Keeps the gradient buffers (and DDP's bucket views): no fresh pages.
        opt.zero_grad(set_to_none=False)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return times, loss


def gemm_peak_gflops(linear_impl, n=2048, min_seconds=1.0):
    import torch
    a, b = torch.randn(n, n), torch.randn(n, n)
    if linear_impl == "mkldnn":
        am = a.to_mkldnn()
        run = lambda: torch._C._nn.mkldnn_linear(am, b, None)  # noqa: E731
    else:
        run = lambda: torch.mm(a, b)  # noqa: E731
    run()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best / 1e9


def blas_library():
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if line.split()[-1].startswith("/")}
    # The system's BLAS, not PyPI torch's libcublas (loaded, unused on CPU).
    libs = {p for p in paths if Path(p).name.startswith(("libblas", "libopenblas"))}
    if libs:
        return ",".join(sorted(Path(p).parent.name + "/" + Path(p).name for p in libs))
    import torch  # no BLAS library of its own: linked into libtorch_cpu (PyPI's MKL)
    words = torch.__config__.show().replace(",", " ").split()
    info = [w for w in words if w.startswith("BLAS_INFO=")]
    return "linked-in/" + (info[0].split("=", 1)[1] if info else "unknown")


def parse_figures(text):
    """The `name: value` lines of a child's output as a dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out[key.strip()] = value.strip()
    return out
