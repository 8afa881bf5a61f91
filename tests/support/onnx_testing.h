// For tests of the ONNX export: tensors to and from ONNX TensorProto files
// (the format tools/onnx_run.py reads and writes), running a model in ONNX
// Runtime through that script, and dtrain's own logits of a checkpoint step
// (nn::Model::infer on the host device) to compare with.
//
// ONNX Runtime lives in the project's virtual environment (.venv/, made by
// scripts/setup.sh); without it these helpers fail the test saying so.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <onnx/onnx_pb.h>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "nn/cpu/host_device.h"
#include "nn/parameters.h"
#include "nn/transformer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::testing {

// Trains `json` for 5 steps (micro-batch 4) into dir/name and returns its checkpoint root.
inline std::filesystem::path train_checkpoint(const TempDir& dir, const std::string& name, const std::string& json) {
  const std::filesystem::path config = dir.write(name + ".json", json);
  const std::filesystem::path root = dir / (name + "_ckpt");
  const CommandResult r = run_command(fmt::format(
      "{}/dtrain-worker --config {} --set train.steps=5 --set train.micro_batch_size=4 --set optimizer.lr=3e-3 "
      "--set checkpoint.every_steps=5 --set checkpoint.dir={} --set train.out_dir={}",
      bin_dir(), config.string(), root.string(), (dir / (name + "_run")).string()));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return root;
}

// dtrain-ckpt with `args`.
inline CommandResult ckpt(const std::string& args) { return run_command(bin_dir() + "/dtrain-ckpt " + args); }

// Fails the current test unless the virtual environment with ONNX Runtime exists.
inline void require_onnx_runtime() {
  if (!std::filesystem::exists(venv_python())) {
    FAIL() << venv_python() << " is missing: run scripts/setup.sh, which installs ONNX Runtime into .venv/";
  }
}

template <class T>
void write_tensor(const std::filesystem::path& file, const std::string& name, const std::vector<std::int64_t>& dims,
                  const std::vector<T>& values) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(std::is_same_v<T, float> ? onnx::TensorProto::FLOAT : onnx::TensorProto::INT64);
  for (std::int64_t d : dims) t.add_dims(d);
  t.set_raw_data(std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T)));
  std::ofstream out(file, std::ios::binary);
  ASSERT_TRUE(t.SerializeToOstream(&out)) << file;
}

// A float tensor written by onnx_run.py (numpy_helper.from_array: raw_data).
inline std::vector<float> read_float_tensor(const std::filesystem::path& file, std::vector<std::int64_t>* dims) {
  onnx::TensorProto t;
  std::ifstream in(file, std::ios::binary);
  if (!t.ParseFromIstream(&in)) throw Error("cannot parse the TensorProto " + file.string());
  if (t.data_type() != onnx::TensorProto::FLOAT) throw Error(file.string() + " is not a float tensor");
  dims->assign(t.dims().begin(), t.dims().end());
  std::vector<float> v(t.raw_data().size() / sizeof(float));
  std::memcpy(v.data(), t.raw_data().data(), v.size() * sizeof(float));
  return v;
}

inline onnx::ModelProto read_onnx(const std::filesystem::path& file) {
  onnx::ModelProto m;
  std::ifstream in(file, std::ios::binary);
  if (!m.ParseFromIstream(&in)) throw Error("cannot parse the ONNX model " + file.string());
  return m;
}

// The folder of data set `i` under `root`, in ONNX's test-data layout.
inline std::filesystem::path data_set(const std::filesystem::path& root, int i) {
  return root / ("test_data_set_" + std::to_string(i));
}

// Runs `model` in ONNX Runtime (one thread) on every test_data_set_*/ under
// `root` (their input_*.pb), which then also hold ort_output_0.pb, ...
// (onnx_run.py --data-sets). `extra`: more onnx_run.py options.
inline void run_onnx_data_sets(const std::filesystem::path& model, const std::filesystem::path& root,
                               const std::string& extra = "") {
  const std::string command = venv_python() + " " + source_dir() + "/tools/onnx_run.py " + model.string() +
                              " --data-sets " + root.string() + " " + extra;
  const CommandResult r = run_command(command);
  if (r.exit_code != 0) throw Error("onnx_run.py failed (" + command + "):\n" + r.output);
}

// dtrain's own logits of the step's parameters for `batch` rows of `seq`
// tokens (or patches): [batch, seq, vocab] (lm) or [batch, classes].
inline std::vector<float> dtrain_logits(const std::filesystem::path& step, std::int64_t batch, std::int64_t seq,
                                        const std::vector<std::int32_t>& tokens, const std::vector<float>& patches) {
  checkpoint::Env& env = *checkpoint::default_env();
  const checkpoint::Manifest manifest = checkpoint::read_manifest(env, step);
  const nn::ModelConfig config = worker::model_config(worker::parse_config_json(manifest.config_json()));
  const nn::ParameterLayout layout = nn::declare_parameters(config);
  nn::ParameterStore store(layout, 0);
  for (int b = 0; b < layout.num_blocks(); ++b) {
    const std::int64_t n = layout.blocks()[static_cast<std::size_t>(b)].numel;
    checkpoint::read_range(env, step, manifest, checkpoint::Range{"params", b, 0, n},
                           store.params().data() + layout.block_offset(b));
  }
  nn::cpu::HostDevice device;
  std::unique_ptr<nn::Model> model = device.make_model(config, layout, batch, seq);
  model->bind(store.pointers());
  nn::BlockHooks no_hooks;
  const std::int64_t rows = config.kind == nn::ModelConfig::Kind::lm ? batch * seq : batch;
  std::vector<float> logits(static_cast<std::size_t>(rows * config.outputs()));
  model->infer(nn::ModelInputs{tokens.empty() ? nullptr : tokens.data(), patches.empty() ? nullptr : patches.data(),
                               nullptr},
               no_hooks, logits.data());
  return logits;
}

}  // namespace dtrain::testing
