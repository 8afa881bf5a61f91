// Reading a checkpoint back as a model, for the tools that use one outside
// training (dtrain-ckpt, dtrain-generate): which step a folder means, the
// model and parameter layout of the run that saved it (checked against the
// manifest), and its fp32 parameters block by block through the resharding
// reads (any world size, ZeRO stage or precision saved it).
// Every function throws dtrain::Error (IoError) naming the folder or file.
#pragma once

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "nn/transformer.h"
#include "proto/config.pb.h"

namespace dtrain::tools {

// A step directory: one holding a manifest or named like one (step_NNNNNNNNN).
bool is_step_dir(checkpoint::Env& env, const std::filesystem::path& dir);
// IoError unless `dir` is a directory.
void require_directory(checkpoint::Env& env, const std::filesystem::path& dir);

// The step to read under DIR: DIR itself, the one `latest` names (when it is
// committed), else the newest committed step.
std::filesystem::path resolve_step(checkpoint::Env& env, const std::filesystem::path& dir);

struct SavedModel {
  config::Config config;  // the run's resolved config, from the manifest
  nn::ModelConfig model;
  nn::ParameterLayout layout;
};

// The model of the run that saved the step, checked against the manifest's
// blocks: slicing a block by a layout it was not saved with would silently
// produce wrong tensors.
SavedModel rebuild_model(const checkpoint::Manifest& manifest, const std::filesystem::path& step);

// Block b's fp32 parameters into `out` (layout.blocks()[b].numel elements).
void read_block_params(checkpoint::Env& env, const std::filesystem::path& step, const checkpoint::Manifest& manifest,
                       const nn::ParameterLayout& layout, int b, float* out);

}  // namespace dtrain::tools
