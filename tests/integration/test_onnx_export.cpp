// dtrain-ckpt export --format onnx|triton end to end, on checkpoints the real
// dtrain-worker wrote, checked in a real runtime (ONNX Runtime from PyPI,
// through tools/onnx_run.py):
//   - ONNX Runtime's logits equal dtrain's own forward (nn::Model::infer) on
//     random inputs, two batch sizes x two sequence lengths, for both models
//     and both inputs, today's block, GPT-2's (tanh GELU) and the LLaMA
//     family's (RMSNorm, rotary positions, SwiGLU, no biases, 2 key/value
//     heads for 4 query heads; tied and untied), within 1e-4 of the largest
//     |logit|;
//   - a ZeRO-3 checkpoint of 2 ranks and one saved by a bf16 run, holding the
//     same state as a 1-rank fp32 one, export the same graph byte for byte;
//   - a Triton repository entry whose config.pbtxt parses back and matches
//     the graph's inputs and outputs;
//   - bad input (a damaged step, an existing output, an unknown format or
//     quantization) is an error that names what is wrong; nothing is overwritten.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "export/triton_config.h"
#include "support/onnx_testing.h"
#include "support/temp_dir.h"
#include "support/thread_ranks.h"

namespace dtrain::testing {
namespace {

namespace ck = dtrain::checkpoint;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct TinyRun {
  const char* name;
  const char* json;
  std::vector<std::int64_t> seqs;  // the two sequence lengths tried
};

// Every kind of graph the export writes: tied and untied lm heads, patch and
// token classifiers, and the block's pieces (GPT-2's tanh GELU; the LLaMA
// family's, with an eps and a theta of their own so that a default is not
// taken for them).
const std::vector<TinyRun> kRuns = {
    {"lm_tied", R"({"model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
                              "d_ff": 64, "max_seq_len": 16, "tie_embeddings": true},
                    "data": {"kind": "synthetic", "seq_len": 16}})", {16, 7}},
    {"lm_untied", R"({"model": {"kind": "lm", "vocab_size": 50, "d_model": 24, "n_heads": 4, "n_layers": 1,
                                "d_ff": 40, "max_seq_len": 12},
                      "data": {"kind": "synthetic", "seq_len": 12}})", {12, 5}},
    {"patches", R"({"model": {"kind": "classifier", "input": "patches", "patch_size": 7, "d_model": 32,
                              "n_heads": 2, "n_layers": 2, "d_ff": 64, "max_seq_len": 16, "num_classes": 10},
                    "data": {"kind": "fashion_mnist", "seq_len": 16}})", {16, 9}},
    {"tokens", R"({"model": {"kind": "classifier", "vocab_size": 40, "d_model": 32, "n_heads": 4,
                             "n_layers": 1, "d_ff": 48, "max_seq_len": 12, "num_classes": 5},
                   "data": {"kind": "synthetic", "seq_len": 12}})", {12, 4}},
    {"gpt2_tanh", R"({"model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
                                "d_ff": 64, "max_seq_len": 16, "tie_embeddings": true, "mlp": "gelu_tanh"},
                      "data": {"kind": "synthetic", "seq_len": 16}})", {16, 7}},
    {"llama_tied", R"({"model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
                                 "n_layers": 2, "d_ff": 48, "max_seq_len": 16, "tie_embeddings": true,
                                 "norm": "rmsnorm", "norm_eps": 1e-6, "position": "rope", "rope_theta": 500,
                                 "mlp": "swiglu", "bias": false},
                       "data": {"kind": "synthetic", "seq_len": 16}})", {16, 7}},
    {"llama_untied", R"({"model": {"kind": "lm", "vocab_size": 50, "d_model": 32, "n_heads": 4, "n_kv_heads": 2,
                                   "n_layers": 2, "d_ff": 40, "max_seq_len": 12, "norm": "rmsnorm",
                                   "position": "rope", "mlp": "swiglu", "bias": false},
                         "data": {"kind": "synthetic", "seq_len": 12}})", {12, 5}},
};

// The export `args` fails (exit 2) with `message` in its output.
void expect_refused(const std::string& args, const std::string& message) {
  const CommandResult r = ckpt(args);
  EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
  EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
}

void expect_export(const std::string& args) {
  const CommandResult r = ckpt(args);
  ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

TEST(OnnxExport, OnnxRuntimeComputesDtrainsLogits) {
  require_onnx_runtime();
  TempDir dir;
  std::mt19937 rng(7);
  for (const TinyRun& run : kRuns) {
    const fs::path root = train_checkpoint(dir, run.name, run.json);
    const fs::path model = dir / (std::string(run.name) + ".onnx");
    expect_export(fmt::format("export {} --format onnx --out {}", root.string(), model.string()));
    const ck::Manifest manifest = ck::read_manifest(*ck::default_env(), ck::step_dir(root, 5));
    const nn::ModelConfig c = worker::model_config(worker::parse_config_json(manifest.config_json()));
    // Four data sets (two batch sizes x two lengths) in one run of ONNX Runtime.
    struct Case {
      std::int64_t batch, seq;
      std::vector<std::int32_t> tokens;
      std::vector<float> patches;
    };
    std::vector<Case> cases;
    const fs::path sets = dir / (std::string(run.name) + "_data");
    for (std::int64_t batch : {1, 3}) {
      for (std::int64_t seq : run.seqs) {
        Case k{batch, seq, {}, {}};
        const fs::path input = data_set(sets, static_cast<int>(cases.size())) / "input_0.pb";
        fs::create_directories(input.parent_path());
        if (c.input == nn::ModelConfig::Input::tokens) {
          std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(c.vocab_size) - 1);
          k.tokens.resize(static_cast<std::size_t>(batch * seq));
          for (auto& t : k.tokens) t = token(rng);
          write_tensor(input, "tokens", {batch, seq}, std::vector<std::int64_t>(k.tokens.begin(), k.tokens.end()));
        } else {
          std::normal_distribution<float> pixel(0.0f, 1.0f);
          k.patches.resize(static_cast<std::size_t>(batch * seq * c.patch_dim));
          for (auto& p : k.patches) p = pixel(rng);
          write_tensor(input, "patches", {batch, seq, c.patch_dim}, k.patches);
        }
        cases.push_back(std::move(k));
      }
    }
    run_onnx_data_sets(model, sets, "--check");
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& k = cases[i];
      const std::string what = fmt::format("{} batch {} seq {}", run.name, k.batch, k.seq);
      std::vector<std::int64_t> dims;
      const std::vector<float> onnx = read_float_tensor(data_set(sets, static_cast<int>(i)) / "ort_output_0.pb", &dims);
      const std::vector<float> native = dtrain_logits(ck::step_dir(root, 5), k.batch, k.seq, k.tokens, k.patches);
      const std::vector<std::int64_t> want_dims =
          c.kind == nn::ModelConfig::Kind::lm ? std::vector<std::int64_t>{k.batch, k.seq, c.vocab_size}
                                              : std::vector<std::int64_t>{k.batch, c.num_classes};
      ASSERT_EQ(dims, want_dims) << what;
      ASSERT_EQ(onnx.size(), native.size()) << what;
      const double scale = max_abs(native);
      ASSERT_GT(scale, 0.0) << what;
      double worst = 0.0;
      for (std::size_t j = 0; j < onnx.size(); ++j) {
        worst = std::max(worst, std::fabs(static_cast<double>(onnx[j]) - native[j]) / scale);
      }
      EXPECT_LE(worst, 1e-4) << what << ": largest |logit| " << scale;
      std::cout << fmt::format("{}: max |onnx - infer| / max |logit| = {:.2e}\n", what, worst);
    }
  }
}

// The same state saved by 1 rank (fp32), by 2 ranks under ZeRO-3, and by a
// bf16 run: the 2-rank and bf16 saves resume the 1-rank step and save it again
// without training, so the three hold identical fp32 masters.
TEST(OnnxExport, AnyWorldStageOrPrecisionExportsTheSameGraph) {
  TempDir dir;
  const fs::path one = train_checkpoint(dir, "one", kRuns[0].json);
  const fs::path step = ck::step_dir(one, 5);
  const std::string json = fmt::format(R"({{"model": {{"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2,
      "n_layers": 2, "d_ff": 64, "max_seq_len": 16, "tie_embeddings": true}},
      "data": {{"kind": "synthetic", "seq_len": 16}}, "optimizer": {{"lr": 3e-3}},
      "train": {{"steps": 5, "micro_batch_size": 4, "out_dir": "{}"}},
      "checkpoint": {{"resume": "{}"}}}})", (dir / "resaved").string(), step.string());
  auto resave = [&](const fs::path& root, std::vector<std::string> overrides) {
    overrides.push_back("checkpoint.dir=" + root.string());
    const config::Config config = worker::parse_config_json(json, overrides);
    const int world = config.parallel().zero_stage() == 3 ? 2 : 1;
    run_gloo_ranks(world, 60s, [&](comm::Communicator& comm) {
      worker::TrainerOptions options;
      options.write_outputs = false;
      options.comm = std::shared_ptr<comm::Communicator>(&comm, [](comm::Communicator*) {});
      worker::Trainer trainer(config, options);
      ASSERT_EQ(trainer.steps_done(), 5);
      trainer.save_checkpoint();
    });
  };
  const fs::path zero3 = dir / "zero3", bf16 = dir / "bf16";
  resave(zero3, {"parallel.zero_stage=3", "train.micro_batch_size=2"});
  resave(bf16, {"precision=bf16"});
  const ck::Manifest sharded = ck::read_manifest(*ck::default_env(), ck::step_dir(zero3, 5));
  ASSERT_EQ(sharded.world_size(), 2);
  ASSERT_EQ(sharded.zero_stage(), 3);

  for (const std::string quantize : {"", " --quantize int8"}) {
    std::vector<onnx::ModelProto> models;
    for (const fs::path& root : {one, zero3, bf16}) {
      const fs::path file = dir / (root.filename().string() + (quantize.empty() ? ".onnx" : ".int8.onnx"));
      expect_export(fmt::format("export {} --format onnx --out {}{}", root.string(), file.string(), quantize));
      models.push_back(read_onnx(file));
    }
    ASSERT_GT(models[0].graph().initializer_size(), 10);
    for (std::size_t m = 1; m < models.size(); ++m) {
      EXPECT_EQ(models[m].graph().SerializeAsString(), models[0].graph().SerializeAsString())
          << "export " << m << quantize;
    }
  }
}

TEST(OnnxExport, TritonRepositoryMatchesTheGraph) {
  TempDir dir;
  const fs::path lm = train_checkpoint(dir, "lm", kRuns[0].json);
  const fs::path cls = train_checkpoint(dir, "cls", kRuns[2].json);
  const fs::path repo = dir / "models";
  expect_export(fmt::format("export {} --format triton --out {} --max-batch 16", lm.string(), repo.string()));
  expect_export(fmt::format("export {} --format triton --out {} --name fashion --quantize int8", cls.string(),
                            repo.string()));
  struct Entry {
    std::string name;
    int max_batch;
    triton::ModelInstanceGroup::Kind kind;
  };
  for (const Entry& e : {Entry{"dtrain_lm", 16, triton::ModelInstanceGroup::KIND_AUTO},
                         Entry{"fashion", 32, triton::ModelInstanceGroup::KIND_CPU}}) {
    const fs::path config_file = repo / e.name / "config.pbtxt";
    const triton::ModelConfig config = exporter::parse_pbtxt(read_file(config_file), config_file.string());
    const onnx::ModelProto model = read_onnx(repo / e.name / "1" / "model.onnx");
    EXPECT_EQ(config.name(), e.name);
    EXPECT_EQ(config.platform(), "onnxruntime_onnx");
    EXPECT_EQ(config.max_batch_size(), e.max_batch);
    EXPECT_TRUE(config.has_dynamic_batching());
    ASSERT_EQ(config.instance_group_size(), 1);
    EXPECT_EQ(config.instance_group(0).kind(), e.kind);
    ASSERT_EQ(config.input_size(), model.graph().input_size());
    ASSERT_EQ(config.output_size(), model.graph().output_size());
    auto expect_same = [&](const auto& entry, const onnx::ValueInfoProto& value) {
      EXPECT_EQ(entry.name(), value.name());
      EXPECT_EQ(entry.data_type(), exporter::triton_type(value.type().tensor_type().elem_type())) << value.name();
      const auto& shape = value.type().tensor_type().shape();
      ASSERT_EQ(entry.dims_size() + 1, shape.dim_size()) << value.name();
      EXPECT_EQ(shape.dim(0).dim_param(), "batch") << value.name();
      for (int i = 0; i < entry.dims_size(); ++i) {
        const auto& dim = shape.dim(i + 1);
        EXPECT_EQ(entry.dims(i), dim.has_dim_value() ? dim.dim_value() : -1) << value.name() << " dim " << i + 1;
      }
    };
    for (int i = 0; i < config.input_size(); ++i) expect_same(config.input(i), model.graph().input(i));
    for (int i = 0; i < config.output_size(); ++i) expect_same(config.output(i), model.graph().output(i));
  }
  // The expected dims, spelled out once: tokens [-1] -> logits [-1, 64]; patches [-1, 49] -> logits [10].
  const triton::ModelConfig lm_config =
      exporter::parse_pbtxt(read_file(repo / "dtrain_lm" / "config.pbtxt"), "lm");
  EXPECT_EQ(lm_config.input(0).data_type(), triton::TYPE_INT64);
  EXPECT_EQ(std::vector<std::int64_t>(lm_config.output(0).dims().begin(), lm_config.output(0).dims().end()),
            (std::vector<std::int64_t>{-1, 64}));

  // A second export to the same name is refused and leaves the entry as it was.
  const std::string before = read_file(repo / "fashion" / "config.pbtxt");
  const CommandResult again =
      ckpt(fmt::format("export {} --format triton --out {} --name fashion", cls.string(), repo.string()));
  EXPECT_EQ(again.exit_code, 2) << again.output;
  EXPECT_NE(again.output.find((repo / "fashion").string() + "' already exists"), std::string::npos) << again.output;
  EXPECT_EQ(read_file(repo / "fashion" / "config.pbtxt"), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(repo), {}), 2);  // no temporary directory left
}

TEST(OnnxExport, BadInputIsAClearErrorAndNothingIsOverwritten) {
  TempDir dir;
  const fs::path root = train_checkpoint(dir, "lm", kRuns[1].json);
  const fs::path out = dir / "out";
  fs::create_directories(out);

  // An existing file is never overwritten.
  const fs::path taken = out / "taken.onnx";
  std::ofstream(taken) << "keep me";
  expect_refused(fmt::format("export {} --format onnx --out {}", root.string(), taken.string()),
                 taken.string() + "' already exists; not overwriting it");
  EXPECT_EQ(read_file(taken), "keep me");

  // Unknown formats, quantizations and misplaced options name the option and the choices.
  const std::string bad = "export " + root.string() + " --out " + (out / "m").string();
  expect_refused(bad + " --format tflite",
                 "'--format': 'tflite' is not a format dtrain-ckpt exports: use safetensors, onnx or triton");
  expect_refused(bad + " --format onnx --quantize int4", "'--quantize': 'int4' is not supported: use int8");
  expect_refused(bad + " --format safetensors --quantize int8", "--quantize int8 goes with --format onnx or triton");
  expect_refused(bad + " --format onnx --max-batch 8",
                 "'--max-batch': this option describes a Triton model: use it with --format triton");
  expect_refused(bad + " --format triton --name ../up", "'--name': '../up' cannot name a Triton model directory");

  // A damaged parameter in the rank file: the checksum error names the file and says what to do.
  const fs::path step = ck::step_dir(root, 5);
  const ck::Manifest manifest = ck::read_manifest(*ck::default_env(), step);
  const auto params = std::find_if(manifest.ranges().begin(), manifest.ranges().end(),
                                   [](const ck::RangeRecord& r) { return r.tensor() == "params" && r.block() == 1; });
  ASSERT_NE(params, manifest.ranges().end());
  {
    std::fstream f(step / params->file(), std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(params->offset() + params->count() * 2);
    char byte = 0;
    f.seekg(middle);
    f.get(byte);
    f.seekp(middle);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  for (const std::string format : {"onnx", "triton"}) {
    const std::string args = fmt::format("export {} --format {} --out {}/damaged", root.string(), format, out.string());
    for (const char* message : {"rank_00000.bin", "crc32c", "dtrain-ckpt verify"}) expect_refused(args, message);
  }
  EXPECT_EQ(std::distance(fs::directory_iterator(out), {}), 1);  // only taken.onnx: nothing partial left
}

}  // namespace
}  // namespace dtrain::testing
