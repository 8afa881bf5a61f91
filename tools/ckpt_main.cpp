// dtrain-ckpt: look into and convert dtrain checkpoints.
//   dtrain-ckpt inspect DIR
//   dtrain-ckpt verify DIR [--ignore-uncommitted]   (exit 1 when a step fails to verify or never committed)
//   dtrain-ckpt export DIR --format safetensors --out FILE
//   dtrain-ckpt export DIR --format onnx --out FILE [--quantize int8] [--with-past]
//   dtrain-ckpt export DIR --format triton --out REPO [--name NAME] [--max-batch N] [--quantize int8]
// DIR: a checkpoint root (inspect and export use the step `latest` names) or a
// step directory (step_NNNNNNNNN).
#include <filesystem>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "core/command_line.h"
#include "tools/ckpt_commands.h"

namespace {

CLI::App* add_dir_command(CLI::App& app, const char* name, const char* description, std::string& dir) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->add_option("DIR", dir, "checkpoint root or step directory")->required();
  return cmd;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dtrain-ckpt: inspect, verify and export dtrain checkpoints"};
  app.require_subcommand(1);
  std::string inspect_dir, verify_dir;
  CLI::App* inspect = add_dir_command(app, "inspect", "manifest, model and parameter layout of a step", inspect_dir);
  CLI::App* verify = add_dir_command(app, "verify", "check the files and checksums of committed steps", verify_dir);
  bool ignore_uncommitted = false;
  verify->add_flag("--ignore-uncommitted", ignore_uncommitted,
                   "exit 0 even when a step folder was never committed (it is still listed)");
  dtrain::tools::CkptExportOptions export_options;
  std::string export_dir, export_out;
  CLI::App* exporter = add_dir_command(app, "export", "write the fp32 parameters in another format", export_dir);
  // Formats and quantizations are checked by run_ckpt_export, whose errors say what to use instead.
  exporter->add_option("--format", export_options.format, "safetensors, onnx or triton")->capture_default_str();
  exporter->add_option("--out", export_out, "file to create, or the Triton model repository (never overwritten)")
      ->required();
  exporter->add_option("--quantize", export_options.quantize, "int8: dynamic quantization of every Linear (onnx, triton)");
  exporter->add_option("--name", export_options.name, "triton: the model's name (default dtrain_<kind>[_int8])");
  exporter->add_option("--max-batch", export_options.max_batch, "triton: max_batch_size (default 32)");
  exporter->add_flag("--with-past", export_options.with_past,
                     "onnx, lm: the cached decoder (past_key_values.<l>.key/value in, present.<l>.key/value out)");
  if (const auto code = dtrain::parse_args(app, argc, argv, "dtrain-ckpt")) return *code;
  return dtrain::run_main("dtrain-ckpt", [&] {
    if (inspect->parsed()) return dtrain::tools::run_ckpt_inspect(inspect_dir, std::cout);
    if (verify->parsed()) return dtrain::tools::run_ckpt_verify(verify_dir, std::cout, ignore_uncommitted);
    if (exporter->parsed()) {
      export_options.dir = export_dir;
      export_options.out = export_out;
      return dtrain::tools::run_ckpt_export(export_options, std::cout);
    }
    return 0;
  });
}
