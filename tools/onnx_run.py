#!/usr/bin/env python3
"""Runs an ONNX model in ONNX Runtime (CPU) on inputs read from files and
writes its outputs to files, so C++ tests and scripts can check a model in a
real runtime without Python code of their own.

Files are ONNX TensorProto messages (.pb), the format of ONNX's own test data
sets (onnx.save_tensor / onnx.load_tensor): the C++ side writes and reads them
with the ONNX protobuf classes it already links.

    onnx_run.py MODEL --input NAME=FILE.pb [...] --out-dir DIR [--threads N] [--check]
        writes DIR/<output name>.pb for every output of the model
    onnx_run.py MODEL --data-sets DIR [--threads N] [--check]
        runs every DIR/test_data_set_*/ of ONNX's test-data layout: the
        inputs are its input_*.pb (each TensorProto names its input), the
        outputs go beside them as ort_output_<i>.pb, in the model's output
        order (output_<i>.pb is the layout's name for expected outputs)

    onnx_run.py MODEL --greedy N --input tokens=FILE.pb --out-dir DIR
        greedy decoding with the cached decoder of an lm (dtrain-ckpt export
        --with-past): the prompt [batch, P] runs once with an empty cache, then
        each new token runs alone with the previous run's present.<l>.* fed
        back as past_key_values.<l>.*; N new tokens (argmax of the last
        position's logits). Writes DIR/tokens.pb (int64 [batch, N]) and
        DIR/logits.pb (float [batch, P + N - 1, vocab], the logits of every
        position run, in order)

No file is overwritten: an output file that exists already is an error.
    onnx_run.py MODEL --input NAME=FILE.pb [...] --bench N [--threads N]
        runs the model N times after two warm-up runs and prints
        'latency_ms_median: X' and 'latency_ms_min: Y'

    onnx_run.py MODEL --from-config CONFIG [--batch N] [--out-dir DIR]
        makes the input batch from the data the run's config names (its
        held-out part, as dtrain's loader reads it: data.kind text or
        fashion_mnist), runs the model on it and prints what it checked: the
        input's shape and source, that every logit is finite, and the
        accuracy and mean cross-entropy against the batch's labels (a
        classifier) or next bytes (an lm); --out-dir also writes the outputs
        and the input (<name>.pb)

--check first runs onnx.checker.check_model(full_check=True) (the checker
and strict shape inference of the `onnx` package, a newer one than the
library dtrain builds with). Exit status: 0 on success, 2 on a bad argument
or a model or input that fails (the message says which).

The interpreter is the project's virtual environment (scripts/setup.sh):
.venv/bin/python tools/onnx_run.py ...
"""
import argparse
import glob
import os
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE.pb",
                   help="an input of the model and the TensorProto file that holds it")
    p.add_argument("--out-dir", help="where to write <output name>.pb")
    p.add_argument("--data-sets", metavar="DIR", help="run every DIR/test_data_set_*/ (input_*.pb -> output_*.pb)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--check", action="store_true", help="run onnx's checker with full_check first")
    p.add_argument("--bench", type=int, default=0, metavar="N", help="time N runs instead of writing outputs")
    p.add_argument("--from-config", metavar="CONFIG",
                   help="make the input batch from the data of this training config (a run's config.json)")
    p.add_argument("--batch", type=int, default=8, help="--from-config: rows of the batch (default 8)")
    p.add_argument("--greedy", type=int, default=0, metavar="N",
                   help="greedy decoding of N tokens with the cached decoder (needs --input tokens=... and --out-dir)")
    args = p.parse_args(argv)
    if args.data_sets and (args.input or args.out_dir or args.bench or args.from_config):
        p.error("--data-sets reads its inputs and writes its outputs in DIR: no --input, --out-dir, --bench or "
                "--from-config")
    if args.from_config and args.input:
        p.error("--from-config makes the inputs: no --input")
    if args.batch < 1:
        p.error("--batch must be at least 1")
    if args.greedy and (args.data_sets or args.bench or args.from_config or not args.out_dir or not args.input):
        p.error("--greedy N reads the prompt from --input tokens=FILE.pb and writes to --out-dir DIR; no "
                "--data-sets, --bench or --from-config")
    if args.greedy < 0:
        p.error("--greedy must not be negative")
    if not args.data_sets and not args.bench and not args.out_dir and not args.from_config:
        p.error("give --out-dir DIR, --data-sets DIR, --bench N or --from-config CONFIG")
    return args


def fail(message):
    print(f"onnx_run.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def read_tensor(path, what):
    import onnx
    from onnx import numpy_helper
    try:
        tensor = onnx.load_tensor(path)
        return tensor.name, numpy_helper.to_array(tensor)
    except Exception as e:  # OSError, or protobuf's DecodeError for a file that is not a TensorProto
        fail(f"{what}: cannot read '{path}' as an ONNX TensorProto: {e}")


def write_tensor(path, name, value):
    from onnx import numpy_helper
    try:
        with open(path, "xb") as f:
            f.write(numpy_helper.from_array(value, name).SerializeToString())
    except FileExistsError:
        fail(f"'{path}' already exists; not overwriting it: move it away or write elsewhere")


def load_inputs(specs):
    feeds = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            fail(f"--input '{spec}' is not NAME=FILE.pb")
        feeds[name] = read_tensor(path, f"input '{name}'")[1]
    return feeds


def run(sess, feeds, where):
    wanted = sorted(i.name for i in sess.get_inputs())
    if sorted(feeds) != wanted:
        fail(f"{where}: the model's inputs are {wanted}, given {sorted(feeds)}")
    try:
        return sess.run(None, feeds)
    except Exception as e:  # ORT's own exception types: a bad shape, a token outside the vocabulary
        fail(f"{where}: ONNX Runtime failed: {e}")


def greedy(sess, feeds, steps, where):
    """Greedy decoding with the cache: (new tokens [batch, steps], logits of every position run)."""
    import numpy as np
    if "tokens" not in feeds:
        fail(f"{where}: --greedy reads the prompt from --input tokens=FILE.pb")
    pasts = [i for i in sess.get_inputs() if i.name.startswith("past_key_values.")]
    if not pasts:
        fail(f"{where}: the model has no past_key_values.* inputs: export it with dtrain-ckpt export --with-past")
    names = [o.name for o in sess.get_outputs()]
    tokens = feeds["tokens"].astype(np.int64)
    batch = tokens.shape[0]
    cache = {i.name: np.zeros((batch, i.shape[1], 0, i.shape[3]), dtype=np.float32) for i in pasts}
    new, logits = [], []
    for step in range(steps):
        outputs = dict(zip(names, run(sess, {"tokens": tokens, **cache}, f"{where} (step {step})")))
        logits.append(outputs["logits"])
        past_seq = next(iter(cache.values())).shape[2]
        for name in cache:
            present = outputs["present." + name[len("past_key_values."):]]
            if present.shape[2] != past_seq + tokens.shape[1]:
                fail(f"{where}: {name} holds {present.shape[2]} positions after step {step}, not "
                     f"{past_seq + tokens.shape[1]}")
            cache[name] = present
        tokens = outputs["logits"][:, -1, :].argmax(axis=-1).astype(np.int64)[:, None]
        new.append(tokens)
    return np.concatenate(new, axis=1), np.concatenate(logits, axis=1)


def run_data_sets(sess, root):
    sets = sorted(glob.glob(os.path.join(root, "test_data_set_*")))
    if not sets:
        fail(f"no test_data_set_*/ under '{root}'")
    for d in sets:
        feeds = dict(read_tensor(path, d) for path in sorted(glob.glob(os.path.join(d, "input_*.pb"))))
        for i, (meta, value) in enumerate(zip(sess.get_outputs(), run(sess, feeds, d))):
            write_tensor(os.path.join(d, f"ort_output_{i}.pb"), meta.name, value)


# data/datasets.h and data/fashion_mnist.h: the held-out share of a text
# stream without data.val_path, and Fashion-MNIST's normalisation.
HOLD_OUT_PERCENT = 10
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def read_config(path):
    """The training config as a dict (dtrain's JSON allows // comment lines)."""
    import json
    try:
        with open(path) as f:
            text = "\n".join(line for line in f.read().splitlines() if not line.lstrip().startswith("//"))
        return json.loads(text)
    except (OSError, ValueError) as e:
        fail(f"--from-config: cannot read '{path}' as a JSON config: {e}")


def text_bytes(path):
    """data/text_bytes.cpp: a file, or every file of a folder in name order but the .dat/.u8 indexes."""
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path)
                       if os.path.isfile(os.path.join(path, n)) and not n.endswith((".dat", ".u8")))
    else:
        files = [path]
    data = bytearray()
    for name in files:
        with open(name, "rb") as f:
            data += f.read()
    return bytes(data)


def text_batch(config, rows):
    """The first `rows` windows of the held-out bytes: tokens [rows, seq] and each one's next byte."""
    import numpy as np
    data = config.get("data", {})
    seq = int(data.get("seq_len", 0))
    try:
        if data.get("val_path"):
            where, stream = f"data.val_path '{data['val_path']}'", text_bytes(data["val_path"])
        else:
            stream = text_bytes(data["path"])
            start = len(stream) - len(stream) * HOLD_OUT_PERCENT // 100
            stream = stream[start:]
            where = f"data.path '{data['path']}' (its last {HOLD_OUT_PERCENT}%, held out from training)"
    except (OSError, KeyError) as e:
        fail(f"--from-config: cannot read the text data: {e}")
    if seq < 1 or len(stream) < rows * seq + 1:
        fail(f"--from-config: {len(stream)} held-out bytes do not make {rows} windows of {seq}; lower --batch")
    windows = np.frombuffer(stream[:rows * seq + 1], dtype=np.uint8).astype(np.int64)
    tokens = np.stack([windows[r * seq:(r + 1) * seq] for r in range(rows)])
    targets = np.stack([windows[r * seq + 1:(r + 1) * seq + 1] for r in range(rows)])
    return {"tokens": tokens}, targets, where


def idx_file(path, magic):
    import gzip
    import numpy as np
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    header = np.frombuffer(raw[:4 + 4 * dims], dtype=">i4")
    if header[0] != magic:
        fail(f"--from-config: '{path}' is not an IDX file of magic {magic}")
    return np.frombuffer(raw[4 + 4 * dims:], dtype=np.uint8).reshape(tuple(header[1:]))


def fashion_batch(config, rows):
    """The first `rows` test images (t10k) as patches [rows, n_patches, p*p], normalised as the loader does."""
    import numpy as np
    data, model = config.get("data", {}), config.get("model", {})
    folder = data.get("val_path") or data.get("path") or FASHION_DIR
    p = int(model.get("patch_size") or 0)
    try:
        images = idx_file(os.path.join(folder, "t10k-images-idx3-ubyte.gz"), 2051)[:rows]
        labels = idx_file(os.path.join(folder, "t10k-labels-idx1-ubyte.gz"), 2049)[:rows].astype(np.int64)
    except OSError as e:
        fail(f"--from-config: cannot read Fashion-MNIST in '{folder}': {e}")
    n, h, w = images.shape
    if p < 1 or h % p or w % p:
        fail(f"--from-config: model.patch_size {p} does not divide the {h}x{w} images")
    pixels = (images.astype(np.float32) / 255.0 - FASHION_MEAN) / FASHION_STD
    patches = pixels.reshape(n, h // p, p, w // p, p).transpose(0, 1, 3, 2, 4).reshape(n, (h // p) * (w // p), p * p)
    return {"patches": np.ascontiguousarray(patches, dtype=np.float32)}, labels, f"'{folder}' (t10k, the test split)"


def batch_from_config(path, rows):
    """The model's inputs, the labels to score them against, and where they came from."""
    config = read_config(path)
    kind = config.get("data", {}).get("kind")
    if kind == "text":
        return text_batch(config, rows)
    if kind == "fashion_mnist":
        return fashion_batch(config, rows)
    fail(f"--from-config reads data.kind text and fashion_mnist, not '{kind}'; give the inputs with --input NAME=FILE.pb")


def report_check(feeds, outputs, labels, where):
    """Prints what was checked: the inputs, the outputs' shapes, finiteness and accuracy on the batch."""
    import numpy as np
    for name, value in feeds.items():
        print(f"input {name}: {value.dtype} {list(value.shape)} from {where}")
    logits = outputs[0]
    finite = bool(np.isfinite(logits).all())
    print(f"output logits: {logits.dtype} {list(logits.shape)}, every value finite: {'yes' if finite else 'NO'}")
    right = int((logits.argmax(axis=-1) == labels).sum())
    what = "next-byte predictions" if logits.ndim == 3 else "labels"
    print(f"accuracy on this batch: {right}/{labels.size} {what} ({100.0 * right / labels.size:.1f}%)")
    # The mean cross-entropy, as dtrain's eval line computes it over the same rows.
    z = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    top = z.max(axis=1)
    log_norm = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    loss = float((log_norm - z[np.arange(z.shape[0]), labels.reshape(-1)]).mean())
    print(f"loss on this batch: {loss:.6f}")
    if not finite:
        fail("the model's logits are not all finite")


def session(model_path, threads):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    try:
        return ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for a model it cannot load
        fail(f"ONNX Runtime cannot load '{model_path}': {e}")


def main(argv):
    args = parse_args(argv)
    if not os.path.isfile(args.model):
        fail(f"no model file '{args.model}'")
    if args.check:
        import onnx
        try:
            onnx.checker.check_model(args.model, full_check=True)
        except Exception as e:  # onnx's ValidationError and InferenceError
            fail(f"'{args.model}' fails onnx.checker (full_check): {e}")
    sess = session(args.model, args.threads)
    if args.data_sets:
        run_data_sets(sess, args.data_sets)
        return 0
    if args.from_config:
        feeds, labels, where = batch_from_config(args.from_config, args.batch)
    else:
        feeds = load_inputs(args.input)
    if args.greedy:
        tokens, logits = greedy(sess, feeds, args.greedy, args.model)
        os.makedirs(args.out_dir, exist_ok=True)
        write_tensor(os.path.join(args.out_dir, "tokens.pb"), "tokens", tokens)
        write_tensor(os.path.join(args.out_dir, "logits.pb"), "logits", logits)
        return 0
    outputs = run(sess, feeds, args.model)
    if args.check:
        print(f"onnx.checker (full_check): '{args.model}' passes")
    if args.from_config:
        report_check(feeds, outputs, labels, where)
        if not args.out_dir:
            return 0

    if args.bench:
        sess.run(None, feeds)  # a second warm-up run
        times = []
        for _ in range(args.bench):
            start = time.perf_counter()
            sess.run(None, feeds)
            times.append((time.perf_counter() - start) * 1e3)
        print(f"latency_ms_median: {statistics.median(times):.3f}")
        print(f"latency_ms_min: {min(times):.3f}")
        return 0

    os.makedirs(args.out_dir, exist_ok=True)
    for meta, value in zip(sess.get_outputs(), outputs):
        write_tensor(os.path.join(args.out_dir, meta.name + ".pb"), meta.name, value)
    if args.from_config:  # the batch too, for --input NAME=FILE.pb later
        for name, value in feeds.items():
            write_tensor(os.path.join(args.out_dir, name + ".pb"), name, value)
        print(f"wrote {', '.join(sorted(os.listdir(args.out_dir)))} in '{args.out_dir}'")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
