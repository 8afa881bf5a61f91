// Dynamic int8 quantization of a trained classifier, measured on the whole
// Fashion-MNIST test set (10,000 images) in ONNX Runtime: dtrain-worker
// trains a small patch Transformer for 400 steps (~78% test accuracy, about
// 20 s on one core), dtrain-ckpt exports it in f32 and with --quantize int8,
// and the int8 model must keep its accuracy within 1 point of f32, agree with
// f32's argmax on >= 97% of the images, and be <= 0.35x the f32 file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "data/fashion_mnist.h"
#include "support/onnx_testing.h"
#include "support/temp_dir.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;

constexpr int kPatch = 7;
constexpr int kChunk = 500;  // images per data set (per ONNX Runtime run)

const char* kClassifier = R"({
  "model": {"kind": "classifier", "input": "patches", "patch_size": 7, "d_model": 128, "n_heads": 4,
            "n_layers": 2, "d_ff": 256, "max_seq_len": 16, "num_classes": 10},
  "data": {"kind": "fashion_mnist", "seq_len": 16},
  "optimizer": {"lr": 2e-3, "weight_decay": 0.05, "grad_clip": 1.0},
  "schedule": {"warmup_steps": 30, "decay": "cosine", "min_lr_ratio": 0.1},
  "train": {"steps": 400, "micro_batch_size": 64, "log_every": 100, "eval_every": 400, "eval_batches": 10}
})";

// argmax of every row of the ort_output_0.pb files, data set by data set.
std::vector<int> predictions(const fs::path& sets, int count) {
  std::vector<int> out;
  for (int s = 0; s < count; ++s) {
    std::vector<std::int64_t> dims;
    const fs::path file = data_set(sets, s) / "ort_output_0.pb";
    const std::vector<float> logits = read_float_tensor(file, &dims);
    EXPECT_EQ(dims, (std::vector<std::int64_t>{kChunk, data::kFashionClasses})) << file;
    for (int r = 0; r < kChunk; ++r) {
      const float* row = logits.data() + r * data::kFashionClasses;
      out.push_back(static_cast<int>(std::max_element(row, row + data::kFashionClasses) - row));
    }
    fs::remove(file);  // the next model's run writes its own
  }
  return out;
}

TEST(OnnxInt8, FashionMnistAccuracyHoldsAndTheFileShrinks) {
  require_onnx_runtime();
  TempDir dir;
  const fs::path root = dir / "ckpt";
  const CommandResult trained = run_command(fmt::format(
      "{}/dtrain-worker --config {} --set checkpoint.every_steps=400 --set checkpoint.dir={} --set train.out_dir={}",
      bin_dir(), dir.write("fashion.json", kClassifier).string(), root.string(), (dir / "run").string()));
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const fs::path f32 = dir / "f32.onnx", int8 = dir / "int8.onnx";
  for (const auto& [file, quantize] : {std::pair{f32, ""}, std::pair{int8, " --quantize int8"}}) {
    const CommandResult r = run_command(fmt::format("{}/dtrain-ckpt export {} --format onnx --out {}{}", bin_dir(),
                                                    root.string(), file.string(), quantize));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // The test set as dtrain's loader makes it (normalised 7x7 patches), in data sets of kChunk images.
  const auto test_set = data::FashionMnistDataset::open(data::kFashionMnistDir, "t10k", kPatch);
  ASSERT_EQ(test_set->size() % kChunk, 0);
  const int sets = static_cast<int>(test_set->size() / kChunk);
  data::Batch batch = data::make_batch(test_set->info(), kChunk);
  std::vector<int> labels;
  const fs::path data = dir / "test_set";
  for (int s = 0; s < sets; ++s) {
    for (int r = 0; r < kChunk; ++r) {
      test_set->fill(static_cast<std::int64_t>(s) * kChunk + r, batch, r);
      labels.push_back(batch.targets[static_cast<std::size_t>(r)]);
    }
    fs::create_directories(data_set(data, s));
    write_tensor(data_set(data, s) / "input_0.pb", "patches", {kChunk, 16, kPatch * kPatch}, batch.patches);
  }
  run_onnx_data_sets(f32, data);
  const std::vector<int> f32_pred = predictions(data, sets);
  run_onnx_data_sets(int8, data);
  const std::vector<int> int8_pred = predictions(data, sets);
  ASSERT_EQ(f32_pred.size(), labels.size());
  ASSERT_EQ(int8_pred.size(), labels.size());

  std::int64_t f32_right = 0, int8_right = 0, agree = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    f32_right += f32_pred[i] == labels[i];
    int8_right += int8_pred[i] == labels[i];
    agree += f32_pred[i] == int8_pred[i];
  }
  const double n = static_cast<double>(labels.size());
  const double f32_acc = 100.0 * static_cast<double>(f32_right) / n;
  const double int8_acc = 100.0 * static_cast<double>(int8_right) / n;
  const double agreement = 100.0 * static_cast<double>(agree) / n;
  const double size_ratio = static_cast<double>(fs::file_size(int8)) / static_cast<double>(fs::file_size(f32));
  std::cout << fmt::format("f32 accuracy {:.2f}%, int8 accuracy {:.2f}%, argmax agreement {:.2f}%, int8/f32 file "
                           "size {:.3f} ({} / {} bytes)\n",
                           f32_acc, int8_acc, agreement, size_ratio, fs::file_size(int8), fs::file_size(f32));
  EXPECT_GE(f32_acc, 70.0) << "the trained model is too weak for the comparison to mean much";
  EXPECT_LE(std::abs(int8_acc - f32_acc), 1.0);
  EXPECT_GE(agreement, 97.0);
  EXPECT_LE(size_ratio, 0.35);
}

}  // namespace
}  // namespace dtrain::testing
