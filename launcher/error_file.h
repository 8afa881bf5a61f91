// torchrun's error file: each worker's TORCHELASTIC_ERROR_FILE, where a
// PyTorch program whose entry point is decorated with
// torch.distributed.elastic.multiprocessing.errors.record writes the
// exception that ended it; the agent puts its message in the failure report
// (docs/launcher.md, "Failures and the summary"). As torchrun, one file per
// worker and attempt, under the log folder:
//
//   LOG_DIR/<run id>/attempt_<round>/<rank>/error.json
//
// holding {"message": {"message": "RuntimeError: ...", "extraInfo":
// {"py_callstack": "...", "timestamp": "..."}}}, or {"message": "..."}.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace dtrain::launcher {

// Where the worker of `rank` in rendezvous round `round` reports: absolute
// (log_dir taken from the current folder), so that a program that changes
// its folder still writes there.
std::filesystem::path error_file_path(const std::filesystem::path& log_dir, const std::string& run_id, int round,
                                      int rank);

// error_file_path, its folder created and a file an earlier job of the same
// run id left there removed. Throws IoError naming the folder.
std::filesystem::path prepare_error_file(const std::filesystem::path& log_dir, const std::string& run_id, int round,
                                         int rank);

// The message in the error file at `path`; nullopt when there is none or it
// is not torchrun's JSON.
std::optional<std::string> read_error_message(const std::filesystem::path& path);

}  // namespace dtrain::launcher
