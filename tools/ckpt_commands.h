// The subcommands of dtrain-ckpt: read-only views of a checkpoint (inspect,
// verify) and conversion of its fp32 master parameters to other formats (export).
//
// DIR is either a checkpoint root (the folder holding step_NNNNNNNNN dirs and
// `latest`) or one step directory. Every function throws dtrain::Error (IoError,
// ConfigError) naming the file on failure; their return value is the exit status.
#pragma once

#include <filesystem>
#include <ostream>
#include <string>

namespace dtrain::tools {

// Prints the manifest, the model and its parameter layout of one step: the
// step `latest` names under a root (else the newest committed one) or DIR itself.
int run_ckpt_inspect(const std::filesystem::path& dir, std::ostream& out);

// Checks every committed step under a root (newest first), or the step DIR.
// Returns 0 when every step verifies, 1 otherwise.
int run_ckpt_verify(const std::filesystem::path& dir, std::ostream& out);

struct CkptExportOptions {
  std::filesystem::path dir;
  std::string format = "safetensors";
  std::filesystem::path out;
};

// Writes the step's parameters (tensor "params") to options.out, one tensor
// per layout parameter. Refuses an existing out; never leaves a partial file there.
int run_ckpt_export(const CkptExportOptions& options, std::ostream& out);

}  // namespace dtrain::tools
