#include "data/fashion_mnist.h"

#include <filesystem>

#include "core/error.h"

namespace dtrain::data {
namespace {

constexpr const char* kInstallHint =
    "; install Fashion-MNIST with `apt-get install dataset-fashion-mnist` or point data.path at "
    "a folder holding its four *-ubyte.gz files";

DatasetInfo fashion_info(const IdxImages& images, int patch_size, std::string name) {
  if (patch_size <= 0 || images.rows % patch_size != 0 || images.cols % patch_size != 0) {
    throw ConfigError("model.patch_size",
                      fmt::format("{} does not divide the {}x{} images of {}; use a divisor of {} "
                                  "(e.g. 4, 7 or 14 for 28)",
                                  patch_size, images.rows, images.cols, name, images.rows));
  }
  const int patches = (images.rows / patch_size) * (images.cols / patch_size);
  return DatasetInfo{.name = std::move(name),
                     .task = Task::kClassification,
                     .input = Input::kPatches,
                     .seq_len = patches,
                     .num_classes = kFashionClasses,
                     .patch_size = patch_size};
}

}  // namespace

FashionMnistDataset::FashionMnistDataset(IdxImages images, std::vector<uint8_t> labels,
                                         int patch_size, std::string name)
    : Dataset(fashion_info(images, patch_size, std::move(name))),
      images_(std::move(images)),
      labels_(std::move(labels)) {
  if (static_cast<int64_t>(labels_.size()) != images_.count) {
    throw DataError(fmt::format("{}: {} images but {} labels; the files do not belong together",
                                info().name, images_.count, labels_.size()));
  }
  for (std::size_t i = 0; i < labels_.size(); ++i) {
    if (labels_[i] >= kFashionClasses) {
      throw DataError(fmt::format("{}: label {} of example {} is not a class in [0, {})",
                                  info().name, labels_[i], i, kFashionClasses));
    }
  }
  for (int b = 0; b < 256; ++b) {
    normalized_[b] = (static_cast<float>(b) / 255.0f - kFashionMean) / kFashionStd;
  }
}

std::shared_ptr<FashionMnistDataset> FashionMnistDataset::open(const std::string& dir,
                                                               const std::string& split,
                                                               int patch_size) {
  const std::filesystem::path base(dir);
  const std::string images_path = (base / (split + "-images-idx3-ubyte.gz")).string();
  const std::string labels_path = (base / (split + "-labels-idx1-ubyte.gz")).string();
  IdxImages images = read_idx_images(images_path, kInstallHint);
  std::vector<uint8_t> labels = read_idx_labels(labels_path, kInstallHint);
  return std::make_shared<FashionMnistDataset>(std::move(images), std::move(labels), patch_size,
                                               fmt::format("fashion_mnist '{}' ({})", dir, split));
}

void FashionMnistDataset::fill(int64_t index, Batch& batch, int row) const {
  const int p = info().patch_size;
  const int rows = images_.rows;
  const int cols = images_.cols;
  const int patches_per_row = cols / p;
  const uint8_t* image = images_.pixels.data() + index * rows * cols;
  float* out = batch.patches.data() + static_cast<std::ptrdiff_t>(row) * info().seq_len * p * p;
  for (int patch = 0; patch < info().seq_len; ++patch) {
    const int y0 = (patch / patches_per_row) * p;
    const int x0 = (patch % patches_per_row) * p;
    for (int y = 0; y < p; ++y) {
      const uint8_t* src = image + (y0 + y) * cols + x0;
      for (int x = 0; x < p; ++x) *out++ = normalized_[src[x]];
    }
  }
  batch.targets[static_cast<std::size_t>(row)] = labels_[static_cast<std::size_t>(index)];
}

}  // namespace dtrain::data
