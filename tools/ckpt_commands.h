// The subcommands of dtrain-ckpt: read-only views of a checkpoint (inspect,
// verify) and conversion of its fp32 master parameters to other formats (export).
//
// DIR is either a checkpoint root (the folder holding step_NNNNNNNNN dirs and
// `latest`) or one step directory. Every function throws dtrain::Error (IoError,
// ConfigError) naming the file on failure; their return value is the exit status.
#pragma once

#include <filesystem>
#include <optional>
#include <ostream>
#include <string>

namespace dtrain::tools {

// Prints the manifest, the model and its parameter layout of one step: the
// step `latest` names under a root (else the newest committed one) or DIR itself.
int run_ckpt_inspect(const std::filesystem::path& dir, std::ostream& out);

// Checks every committed step under a root (newest first), or the step DIR,
// and lists every folder that looks like a step but was never committed (no
// manifest, or a pending name). Returns 0 when every committed step verifies
// and nothing is uncommitted (unless ignore_uncommitted), 1 otherwise.
int run_ckpt_verify(const std::filesystem::path& dir, std::ostream& out, bool ignore_uncommitted = false);

struct CkptExportOptions {
  std::filesystem::path dir;
  std::string format = "safetensors";  // safetensors | onnx | triton
  std::filesystem::path out;           // the file (safetensors, onnx) or the model repository (triton)
  std::string quantize;                // "" (f32) or "int8" (onnx, triton)
  std::string name;                    // triton: the model's name; "" picks dtrain_<kind>[_int8]
  std::optional<int> max_batch;        // triton: max_batch_size (default exporter::TritonOptions's)
  bool with_past = false;              // onnx, lm: the cached decoder (past key/values in, present out)
};

// Converts the step's fp32 master parameters (tensor "params", read block by
// block through the resharding reads, whatever world size, ZeRO stage or
// precision saved them):
//   safetensors  one tensor per layout parameter, to options.out;
//   onnx         the model as ONNX (export/onnx_model.h), optionally int8, to options.out;
//                with_past: an lm's cached decoder form instead of the plain graph;
//   triton       OUT/NAME/config.pbtxt and OUT/NAME/1/model.onnx (export/triton_config.h).
// Refuses an existing file or model directory and never leaves a partial one
// there: everything is written aside and moved into place when complete.
// ConfigError names the option that is wrong (--format, --quantize, ...).
int run_ckpt_export(const CkptExportOptions& options, std::ostream& out);

}  // namespace dtrain::tools
