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

No file is overwritten: an output file that exists already is an error.
    onnx_run.py MODEL --input NAME=FILE.pb [...] --bench N [--threads N]
        runs the model N times after two warm-up runs and prints
        'latency_ms_median: X' and 'latency_ms_min: Y'

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
    args = p.parse_args(argv)
    if args.data_sets and (args.input or args.out_dir or args.bench):
        p.error("--data-sets reads its inputs and writes its outputs in DIR: no --input, --out-dir or --bench")
    if not args.data_sets and not args.bench and not args.out_dir:
        p.error("give --out-dir DIR, --data-sets DIR or --bench N")
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


def run_data_sets(sess, root):
    sets = sorted(glob.glob(os.path.join(root, "test_data_set_*")))
    if not sets:
        fail(f"no test_data_set_*/ under '{root}'")
    for d in sets:
        feeds = dict(read_tensor(path, d) for path in sorted(glob.glob(os.path.join(d, "input_*.pb"))))
        for i, (meta, value) in enumerate(zip(sess.get_outputs(), run(sess, feeds, d))):
            write_tensor(os.path.join(d, f"ort_output_{i}.pb"), meta.name, value)


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
    feeds = load_inputs(args.input)
    outputs = run(sess, feeds, args.model)

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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
