// Merging the ranks' Chrome traces (worker/trace.h) into one file with a
// track (pid) per rank, for Perfetto or chrome://tracing.
//
// A worker that wrote its trace records the file's path at
// "<run id>/round<R>/trace/<rank>" in the run's store; at the end of a round
// the agent of node rank 0 merges the files it can read into trace.json
// beside them (train.out_dir, which every node must see, as for checkpoints).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "comm/store.h"

namespace dtrain::launcher {

// Concatenates the traceEvents of `inputs` into `output`. Throws IoError
// naming the file when an input cannot be read, is not JSON or not a Chrome
// trace, or the output cannot be written.
void merge_trace_files(const std::vector<std::filesystem::path>& inputs, const std::filesystem::path& output);

// The traces the round's ranks recorded under `round_prefix` merged into
// trace.json beside the first; returns its path, nullopt when no rank wrote one.
// Throws IoError as merge_trace_files does, CommError when the store fails.
std::optional<std::string> merge_round_traces(comm::Store& store, const std::string& round_prefix, int world_size);

}  // namespace dtrain::launcher
