// dtrain-ckpt export: safetensors, ONNX (f32 or int8) and Triton model
// repositories from a checkpoint step (tools/ckpt_commands.h).
#include <fcntl.h>  // AT_FDCWD
#include <stdio.h>  // renameat2
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "export/onnx_model.h"
#include "export/onnx_writer.h"
#include "export/safetensors.h"
#include "export/triton_config.h"
#include "tools/ckpt_commands.h"
#include "tools/checkpoint_model.h"
#include "worker/config.h"
#include "worker/trainer.h"

namespace dtrain::tools {
namespace {

namespace ck = dtrain::checkpoint;
namespace fs = std::filesystem;

// Checkpoint files hold little-endian f32 and read_range copies them as they
// are; safetensors is little-endian too, so the bytes pass through unchanged.
static_assert(std::endian::native == std::endian::little, "dtrain-ckpt assumes a little-endian host");

// The safetensors metadata: the model's shape and conventions, as strings
// (safetensors' rule), so that the file describes itself.
nlohmann::ordered_json safetensors_metadata(const ck::Manifest& manifest) {
  const nn::ModelConfig m = worker::model_config(worker::parse_config_json(manifest.config_json()));
  const bool lm = m.kind == nn::ModelConfig::Kind::lm;
  return {
      {"format", "pt"},
      {"source", "dtrain"},
      {"step", std::to_string(manifest.step())},
      {"kind", lm ? "lm" : "classifier"},
      {"input", m.input == nn::ModelConfig::Input::tokens ? "tokens" : "patches"},
      {"vocab_size", std::to_string(m.vocab_size)},
      {"d_model", std::to_string(m.d_model)},
      {"n_heads", std::to_string(m.n_heads)},
      {"n_layers", std::to_string(m.n_layers)},
      {"d_ff", std::to_string(m.d_ff)},
      {"max_seq_len", std::to_string(m.max_seq_len)},
      {"num_classes", std::to_string(lm ? 0 : m.num_classes)},
      {"patch_dim", std::to_string(m.patch_dim)},
      {"tie_embeddings", m.tie_embeddings ? "true" : "false"},
      {"block", "pre-norm"},
      {"norm", m.norm == nn::ModelConfig::Norm::rmsnorm ? "rmsnorm" : "layernorm"},
      {"norm_eps", fmt::format("{}", m.norm_eps)},
      {"position", m.position == nn::ModelConfig::Position::rope ? "rope" : "learned"},
      {"rope_theta", fmt::format("{}", m.rope_theta)},
      {"mlp", m.mlp == nn::ModelConfig::Mlp::swiglu      ? "swiglu"
              : m.mlp == nn::ModelConfig::Mlp::gelu_tanh ? "gelu_tanh"
                                                         : "gelu"},
      {"n_kv_heads", std::to_string(m.kv_heads())},
      {"bias", m.bias ? "true" : "false"},
      {"qkv", "one [(n_heads + 2 * n_kv_heads) * head_dim, d_model] weight, rows q|k|v, heads contiguous within "
              "each"},
      {"lm_head_bias", "none"},
      {"config", manifest.config_json()},
  };
}

// Reads block b's parameters through the resharding reads (which check every
// record's checksum); a damaged step says what to do instead.
exporter::BlockReader block_reader(ck::Env& env, const fs::path& step, const ck::Manifest& manifest,
                                   const nn::ParameterLayout& layout) {
  return [&env, step, &manifest, &layout](int block, std::span<float> out) {
    DTRAIN_CHECK(static_cast<std::int64_t>(out.size()) == layout.blocks()[static_cast<std::size_t>(block)].numel,
                 "block {}: {} elements wanted", block, out.size());
    try {
      read_block_params(env, step, manifest, layout, block, out.data());
    } catch (const IoError& e) {
      throw IoError(fmt::format("{}; this step cannot be exported: `dtrain-ckpt verify {}` shows which steps are "
                                "intact; export one of those", e.what(), step.parent_path().string()));
    }
  };
}

// Streams the model into `file` block by block (export/onnx_writer.h).
void write_onnx(const onnx::ModelProto& graph, const SavedModel& model, const exporter::BlockReader& read, bool int8,
                ck::WritableFile& file) {
  exporter::write_onnx_model(graph, model.model, model.layout, read, int8,
                             [&file](const void* data, std::size_t n) { file.append(data, n); });
}

fs::path temp_beside(const fs::path& out) {
  const fs::path parent = out.has_parent_path() ? out.parent_path() : ".";
  return parent / fmt::format(".{}.tmp.{}", out.filename().string(), ::getpid());
}

void refuse_existing(ck::Env& env, const fs::path& out) {
  if (env.exists(out)) {
    throw IoError(fmt::format("'{}' already exists; not overwriting it: choose another --out (or --name) or move "
                              "it away", out.string()));
  }
}

// Moves `tmp` to `out` unless `out` exists: link() fails with EEXIST instead
// of replacing, so a file created after the first check is not clobbered either.
void publish_file(ck::Env& env, const fs::path& tmp, const fs::path& out) {
  if (::link(tmp.c_str(), out.c_str()) == 0) {
    env.remove_file(tmp);
    return;
  }
  // EEXIST: `out` appeared meanwhile, refused here. Filesystems without hard
  // links: this check has to do.
  refuse_existing(env, out);
  env.rename(tmp, out);
}

// The same for a directory: renameat2's RENAME_NOREPLACE, else check and rename.
void publish_dir(ck::Env& env, const fs::path& tmp, const fs::path& out) {
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) == 0) return;
  refuse_existing(env, out);  // EEXIST, or a filesystem without RENAME_NOREPLACE
  env.rename(tmp, out);
}

// Writes `out` through `write` into a file beside it, synced, then moves it into place.
void write_new_file(ck::Env& env, const fs::path& out, const std::function<void(ck::WritableFile&)>& write) {
  const fs::path tmp = temp_beside(out);
  try {
    std::unique_ptr<ck::WritableFile> file = env.new_writable_file(tmp);
    write(*file);
    file->sync();
    file->close();
    publish_file(env, tmp, out);
    env.sync_dir(out.has_parent_path() ? out.parent_path() : ".");
  } catch (...) {
    env.remove_all(tmp);
    throw;
  }
}

void check_options(const CkptExportOptions& o) {
  if (o.format != "safetensors" && o.format != "onnx" && o.format != "triton") {
    throw ConfigError("--format", fmt::format("'{}' is not a format dtrain-ckpt exports: use safetensors, onnx or "
                                              "triton", o.format));
  }
  if (!o.quantize.empty() && o.quantize != "int8") {
    throw ConfigError("--quantize", fmt::format("'{}' is not supported: use int8, or leave --quantize out for f32",
                                                o.quantize));
  }
  if (!o.quantize.empty() && o.format == "safetensors") {
    throw ConfigError("--quantize", "safetensors holds the f32 master parameters; --quantize int8 goes with "
                                    "--format onnx or triton");
  }
  if (o.with_past && o.format != "onnx") {
    throw ConfigError("--with-past", "the cached decoder is an ONNX graph: use it with --format onnx");
  }
  if (o.format != "triton" && (!o.name.empty() || o.max_batch.has_value())) {
    throw ConfigError(o.name.empty() ? "--max-batch" : "--name", "this option describes a Triton model: use it "
                                                                 "with --format triton");
  }
}

const char* kind_name(const nn::ModelConfig& c) { return c.kind == nn::ModelConfig::Kind::lm ? "lm" : "classifier"; }

// The checked graph; its parameters are streamed in by write_onnx.
onnx::ModelProto onnx_graph(const ck::Manifest& manifest, const SavedModel& model, bool int8, bool with_past) {
  exporter::OnnxOptions options;
  options.int8 = int8;
  options.with_past = with_past;
  options.doc = fmt::format("dtrain {} exported from checkpoint step {} (saved by {} rank(s), ZeRO stage {})",
                            kind_name(model.model), manifest.step(), manifest.world_size(), manifest.zero_stage());
  options.metadata = {{"dtrain.step", std::to_string(manifest.step())}};
  return exporter::build_onnx_graph(model.model, model.layout, options);
}

std::string describe(const SavedModel& model, const ck::Manifest& manifest, bool int8) {
  return fmt::format("{} ({} parameters{}) of step {}", kind_name(model.model), model.layout.total_numel(),
                     int8 ? ", Linear weights int8" : "", manifest.step());
}

}  // namespace

int run_ckpt_export(const CkptExportOptions& options, std::ostream& out) {
  check_options(options);
  ck::Env& env = *ck::default_env();
  const bool int8 = options.quantize == "int8";
  const bool triton = options.format == "triton";
  // Checked first so that a refused export does not read the whole checkpoint.
  if (triton) {
    if (!options.name.empty()) exporter::check_triton_model_name(options.name);
  } else {
    refuse_existing(env, options.out);
  }
  const fs::path step = resolve_step(env, options.dir);
  const ck::Manifest manifest = ck::read_manifest(env, step);
  const SavedModel model = rebuild_model(manifest, step);
  const exporter::BlockReader read = block_reader(env, step, manifest, model.layout);

  if (options.format == "safetensors") {
    write_new_file(env, options.out, [&](ck::WritableFile& f) {
      exporter::write_safetensors(model.layout, safetensors_metadata(manifest), read,
                                  [&f](const void* data, std::size_t n) { f.append(data, n); });
    });
    out << fmt::format("exported {} parameters ({} tensors) of step {} to {}\n", model.layout.total_numel(),
                       model.layout.params().size(), manifest.step(), options.out.string());
    return 0;
  }
  if (!triton) {
    const onnx::ModelProto graph = onnx_graph(manifest, model, int8, options.with_past);
    write_new_file(env, options.out, [&](ck::WritableFile& f) { write_onnx(graph, model, read, int8, f); });
    out << fmt::format("exported {}{} to {} ({} bytes, ONNX opset {})\n", describe(model, manifest, int8),
                       options.with_past ? " as the cached decoder (past key/values in, present out)" : "",
                       options.out.string(), env.file_size(options.out), exporter::kOnnxOpset);
    return 0;
  }

  exporter::TritonOptions t;
  t.name = options.name.empty() ? fmt::format("dtrain_{}{}", kind_name(model.model), int8 ? "_int8" : "") : options.name;
  t.max_batch = options.max_batch.value_or(t.max_batch);
  t.cpu_only = int8;
  const fs::path dir = options.out / t.name;
  refuse_existing(env, dir);
  const onnx::ModelProto graph = onnx_graph(manifest, model, int8, false);
  const std::string pbtxt = exporter::to_pbtxt(exporter::triton_config(graph, t));
  const bool made_repo = !env.exists(options.out);
  env.create_directories(options.out);
  const fs::path tmp = temp_beside(dir);
  try {
    env.create_directories(tmp / exporter::kTritonVersionDir);
    env.write_file(tmp / exporter::kTritonConfigFile, pbtxt, true);
    const fs::path model_file = tmp / exporter::kTritonVersionDir / exporter::kTritonModelFile;
    std::unique_ptr<ck::WritableFile> file = env.new_writable_file(model_file);
    write_onnx(graph, model, read, int8, *file);
    file->sync();
    file->close();
    env.sync_dir(tmp / exporter::kTritonVersionDir);
    env.sync_dir(tmp);
    publish_dir(env, tmp, dir);
    env.sync_dir(options.out);
  } catch (...) {
    env.remove_all(tmp);
    if (made_repo && env.list_dir(options.out).empty()) env.remove_all(options.out);
    throw;
  }
  out << fmt::format("exported {} to the Triton model repository {}: {}/{}, {}/{}/{}\n",
                     describe(model, manifest, int8), options.out.string(), t.name, exporter::kTritonConfigFile,
                     t.name, exporter::kTritonVersionDir, exporter::kTritonModelFile);
  return 0;
}

}  // namespace dtrain::tools
