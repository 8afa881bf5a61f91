// dtrain-ckpt end to end, on checkpoints that the real dtrain-worker wrote:
// inspect, verify (also of a corrupted rank file) and the safetensors export
// (today's block and a LLaMA-family one).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "nn/transformer.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::testing {
namespace {

namespace ck = dtrain::checkpoint;

const char* kTinyLm = R"({
  "model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2,
            "d_ff": 64, "max_seq_len": 16},
  "data": {"kind": "synthetic", "seq_len": 16},
  "optimizer": {"lr": 3e-3},
  "train": {"steps": 10, "micro_batch_size": 4, "log_every": 5}
})";

CommandResult ckpt(const std::string& args) { return run_command(bin_dir() + "/dtrain-ckpt " + args); }

// One training run for the whole suite (saves steps 5 and 10); tests that
// damage a checkpoint work on a copy.
class DtrainCkpt : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    config_ = dir_->write("tiny.json", kTinyLm);
    const std::vector<std::string> overrides = {"checkpoint.every_steps=5", "train.steps=10",
                                                "checkpoint.dir=" + root().string(),
                                                "train.out_dir=" + (dir_->path() / "run").string()};
    std::string args;
    for (const auto& o : overrides) args += " --set " + o;
    const CommandResult r = run_command(bin_dir() + "/dtrain-worker --config " + config_.string() + args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    layout_ = nn::declare_parameters(worker::model_config(worker::load_config(config_, overrides)));
  }
  static void TearDownTestSuite() { dir_.reset(); }

  static std::filesystem::path root() { return dir_->path() / "ckpt"; }

  static std::unique_ptr<TempDir> dir_;
  static std::filesystem::path config_;
  static nn::ParameterLayout layout_;
};

std::unique_ptr<TempDir> DtrainCkpt::dir_;
std::filesystem::path DtrainCkpt::config_;
nn::ParameterLayout DtrainCkpt::layout_;

std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST_F(DtrainCkpt, InspectPrintsTheLatestStepAndItsLayout) {
  const CommandResult r = ckpt("inspect " + root().string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("step +10\n"))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("world size +1\n"))) << r.output;
  EXPECT_NE(r.output.find("rank_00000.bin"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("lm, d_model 32, layers 2, " + std::to_string(layout_.total_numel())),
            std::string::npos)
      << r.output;
  for (const nn::ParamSpec& p : layout_.params()) EXPECT_NE(r.output.find(p.name), std::string::npos) << p.name;

  // A step directory is read as it is.
  const CommandResult five = ckpt("inspect " + ck::step_dir(root(), 5).string());
  ASSERT_EQ(five.exit_code, 0) << five.output;
  EXPECT_TRUE(std::regex_search(five.output, std::regex("step +5\n"))) << five.output;
}

TEST_F(DtrainCkpt, VerifyPassesThenNamesTheCorruptFile) {
  const CommandResult ok = ckpt("verify " + root().string());
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("step_000000010: OK"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("step_000000005: OK"), std::string::npos) << ok.output;

  TempDir copy;
  std::filesystem::copy(root(), copy.path() / "ckpt", std::filesystem::copy_options::recursive);
  const std::filesystem::path rank_file = ck::step_dir(copy.path() / "ckpt", 10) / "rank_00000.bin";
  std::fstream f(rank_file, std::ios::in | std::ios::out | std::ios::binary);
  const auto middle = static_cast<std::streamoff>(std::filesystem::file_size(rank_file) / 2);
  char byte = 0;
  f.seekg(middle);
  f.get(byte);
  f.seekp(middle);
  f.put(static_cast<char>(byte ^ 0x5a));
  f.close();

  const CommandResult bad = ckpt("verify " + (copy.path() / "ckpt").string());
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("rank_00000.bin"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("step_000000005: OK"), std::string::npos) << bad.output;
  EXPECT_EQ(ckpt("verify " + ck::step_dir(copy.path() / "ckpt", 10).string()).exit_code, 1);
  EXPECT_EQ(ckpt("verify " + ck::step_dir(copy.path() / "ckpt", 5).string()).exit_code, 0);
}

// A folder that looks like a step but never committed (no manifest, or a
// pending name) is listed and fails verify, unless --ignore-uncommitted.
TEST_F(DtrainCkpt, VerifyListsStepsThatNeverCommitted) {
  TempDir copy;
  const std::filesystem::path dir = copy.path() / "ckpt";
  std::filesystem::copy(root(), dir, std::filesystem::copy_options::recursive);
  std::filesystem::create_directories(ck::step_dir(dir, 15));
  std::filesystem::create_directories(ck::pending_dir(dir, 20));
  const CommandResult r = ckpt("verify " + dir.string());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, ::testing::HasSubstr(ck::step_dir(dir, 15).string() + ": NOT COMMITTED"));
  EXPECT_THAT(r.output, ::testing::HasSubstr(ck::pending_dir(dir, 20).string() + ": NOT COMMITTED"));
  EXPECT_THAT(r.output, ::testing::HasSubstr("step_000000010: OK"));
  const CommandResult ignored = ckpt("verify --ignore-uncommitted " + dir.string());
  EXPECT_EQ(ignored.exit_code, 0) << ignored.output;
  EXPECT_THAT(ignored.output, ::testing::HasSubstr("NOT COMMITTED"));  // still listed
  const CommandResult one = ckpt("verify " + ck::step_dir(dir, 15).string());
  EXPECT_EQ(one.exit_code, 1) << one.output;
  EXPECT_THAT(one.output, ::testing::HasSubstr("no manifest.pb"));
}

// A safetensors file: its bytes, the length of its header and the header.
struct Safetensors {
  std::string bytes;
  std::uint64_t header_size = 0;
  nlohmann::json header;
};

Safetensors read_safetensors(const std::filesystem::path& file) {
  Safetensors st;
  st.bytes = read_bytes(file);
  if (st.bytes.size() < 8) throw std::runtime_error(file.string() + " is shorter than a safetensors header");
  for (int i = 7; i >= 0; --i) {
    st.header_size = (st.header_size << 8) | static_cast<unsigned char>(st.bytes[static_cast<std::size_t>(i)]);
  }
  st.header = nlohmann::json::parse(st.bytes.substr(8, st.header_size));
  return st;
}

TEST_F(DtrainCkpt, ExportWritesSafetensorsOfTheMasterParameters) {
  TempDir out;
  const std::filesystem::path file = out / "model.safetensors";
  const CommandResult r = ckpt("export " + root().string() + " --format safetensors --out " + file.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const Safetensors st = read_safetensors(file);
  const std::string& bytes = st.bytes;
  const std::uint64_t n = st.header_size;
  ASSERT_EQ(n % 8, 0u);
  ASSERT_LE(8 + n, bytes.size());
  const nlohmann::json& header = st.header;
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
  EXPECT_EQ(header["__metadata__"]["step"], "10");
  // Self-describing: the model's shape and conventions travel with the tensors.
  const nlohmann::json& meta = header["__metadata__"];
  EXPECT_EQ(meta["kind"], "lm");
  EXPECT_EQ(meta["d_model"], "32");
  EXPECT_EQ(meta["n_heads"], "2");
  EXPECT_EQ(meta["n_layers"], "2");
  EXPECT_EQ(meta["tie_embeddings"], "false");
  EXPECT_EQ(meta["norm"], "layernorm");
  EXPECT_EQ(meta["norm_eps"], "1e-05");
  EXPECT_EQ(meta["mlp"], "gelu");
  EXPECT_EQ(meta["position"], "learned");
  EXPECT_EQ(meta["bias"], "true");
  EXPECT_EQ(nlohmann::json::parse(meta["config"].get<std::string>())["model"]["d_ff"], 64);
  EXPECT_EQ(header.size(), layout_.params().size() + 1);

  std::uint64_t offset = 0;
  for (const nn::ParamSpec& p : layout_.params()) {
    ASSERT_TRUE(header.contains(p.name)) << p.name;
    const nlohmann::json& t = header[p.name];
    EXPECT_EQ(t["dtype"], "F32");
    EXPECT_EQ(t["shape"].get<std::vector<std::int64_t>>(), p.shape) << p.name;
    EXPECT_EQ(t["data_offsets"][0].get<std::uint64_t>(), offset) << p.name;
    offset += static_cast<std::uint64_t>(p.numel) * 4;
    EXPECT_EQ(t["data_offsets"][1].get<std::uint64_t>(), offset) << p.name;
  }
  ASSERT_EQ(8 + n + offset, bytes.size());

  // The layout packs each block's parameters back to back, in order, so the
  // data is every block's params, read here through the checkpoint API.
  ck::Env& env = *ck::default_env();
  const std::filesystem::path step = ck::step_dir(root(), 10);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  std::vector<float> expected;
  for (int b = 0; b < layout_.num_blocks(); ++b) {
    std::vector<float> block(static_cast<std::size_t>(layout_.blocks()[static_cast<std::size_t>(b)].numel));
    ck::read_range(env, step, manifest, ck::Range{"params", b, 0, static_cast<std::int64_t>(block.size())},
                   block.data());
    expected.insert(expected.end(), block.begin(), block.end());
  }
  ASSERT_EQ(expected.size() * 4, offset);
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, expected.data(), offset), 0);
}

// A LLaMA-family model's file says which block it holds: RMSNorm, rotary
// positions and their theta, SwiGLU, the key/value heads, no biases; and its
// tensors have the shapes those make.
TEST(DtrainCkptBlock, SafetensorsOfALlamaFamilyModelDescribeItsBlock) {
  TempDir dir;
  const std::filesystem::path config = dir.write("llama.json", R"({
    "model": {"kind": "lm", "vocab_size": 64, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 1,
              "d_ff": 48, "max_seq_len": 16, "norm": "rmsnorm", "norm_eps": 1e-6, "position": "rope",
              "rope_theta": 500, "mlp": "swiglu", "bias": false},
    "data": {"kind": "synthetic", "seq_len": 16},
    "train": {"steps": 2, "micro_batch_size": 2}})");
  const std::filesystem::path root = dir / "ckpt", file = dir / "llama.safetensors";
  const CommandResult trained = run_command(bin_dir() + "/dtrain-worker --config " + config.string() +
                                            " --set checkpoint.every_steps=2 --set checkpoint.dir=" + root.string() +
                                            " --set train.out_dir=" + (dir / "run").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const CommandResult r = ckpt("export " + root.string() + " --format safetensors --out " + file.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json header = read_safetensors(file).header;
  const nlohmann::json& meta = header["__metadata__"];
  EXPECT_EQ(meta["norm"], "rmsnorm");
  EXPECT_EQ(meta["norm_eps"], "1e-06");
  EXPECT_EQ(meta["position"], "rope");
  EXPECT_EQ(meta["rope_theta"], "500");
  EXPECT_EQ(meta["mlp"], "swiglu");
  EXPECT_EQ(meta["n_kv_heads"], "2");
  EXPECT_EQ(meta["bias"], "false");
  // [(4 + 2 * 2) * 8, 32] and SwiGLU's [2 * 48, 32]; no pos_emb, no biases.
  EXPECT_EQ(header["layer.0.qkv.weight"]["shape"], nlohmann::json::parse("[64, 32]"));
  EXPECT_EQ(header["layer.0.fc1.weight"]["shape"], nlohmann::json::parse("[96, 32]"));
  EXPECT_FALSE(header.contains("pos_emb"));
  EXPECT_FALSE(header.contains("layer.0.qkv.bias"));
  EXPECT_FALSE(header.contains("lnf.bias"));
}

TEST_F(DtrainCkpt, ExportRefusesAnExistingFile) {
  TempDir out;
  const std::filesystem::path file = out.write("taken.safetensors", "keep me");
  const CommandResult r = ckpt("export " + root().string() + " --out " + file.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("dtrain-ckpt: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(file.string()), std::string::npos) << r.output;
  EXPECT_EQ(read_file(file), "keep me");
  // Nothing else (no temporary file) is left behind.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(out.path()), {}), 1);
}

TEST_F(DtrainCkpt, MissingDirectoryIsAnError) {
  const CommandResult r = ckpt("inspect " + (root() / "nope").string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("nope"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dtrain::testing
