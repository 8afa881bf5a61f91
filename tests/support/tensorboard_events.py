"""TensorBoard's own reader and writer, for the tests of dtrain's event files
(tests/integration/test_tensorboard.cpp). Runs with .venv/bin/python
(scripts/requirements.txt pins tensorboard).

  read DIR OUT
      Loads DIR with TensorBoard's EventAccumulator (every event kept, its
      purge rules applied) and writes one JSON object to OUT: {"scalars": {tag:
      [[step, value], ...]}, "texts": {tag: [[step, text], ...]},
      "histograms": {tag: [[step, {min, max, num, sum, sum_squares,
      bucket_limit, bucket}], ...]}}. Values are the float32 TensorBoard
      stored, printed exactly.

  write DIR WALL_TIME
      Reads [{"step": S, "values": [[tag, value], ...]}, ...] from stdin and
      writes them with TensorBoard's EventFileWriter into DIR, one Event per
      element, every wall time (the first record's and the file name's too)
      WALL_TIME.
"""

import json
import sys
import time


def read(logdir, out_path):
    from tensorboard.backend.event_processing import event_accumulator as ea

    acc = ea.EventAccumulator(
        logdir,
        size_guidance={ea.SCALARS: 0, ea.TENSORS: 0, ea.HISTOGRAMS: 0},
    )
    acc.Reload()
    tags = acc.Tags()
    out = {"scalars": {}, "texts": {}, "histograms": {}}
    for tag in tags[ea.SCALARS]:
        out["scalars"][tag] = [[e.step, e.value] for e in acc.Scalars(tag)]
    for tag in tags[ea.TENSORS]:
        out["texts"][tag] = [
            [e.step, b"".join(e.tensor_proto.string_val).decode("utf-8")]
            for e in acc.Tensors(tag)
        ]
    for tag in tags[ea.HISTOGRAMS]:
        out["histograms"][tag] = [
            [
                e.step,
                {
                    "min": e.histogram_value.min,
                    "max": e.histogram_value.max,
                    "num": e.histogram_value.num,
                    "sum": e.histogram_value.sum,
                    "sum_squares": e.histogram_value.sum_squares,
                    "bucket_limit": list(e.histogram_value.bucket_limit),
                    "bucket": list(e.histogram_value.bucket),
                },
            ]
            for e in acc.Histograms(tag)
        ]
    with open(out_path, "w") as f:
        json.dump(out, f)


def write(logdir, wall_time):
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    time.time = lambda: wall_time  # the file's name and its first record
    writer = EventFileWriter(logdir)
    for item in json.load(sys.stdin):
        summary = summary_pb2.Summary(
            value=[
                summary_pb2.Summary.Value(tag=tag, simple_value=value)
                for tag, value in item["values"]
            ]
        )
        writer.add_event(
            event_pb2.Event(wall_time=wall_time, step=item["step"], summary=summary)
        )
    writer.close()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "read":
        read(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "write":
        write(sys.argv[2], float(sys.argv[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
