// Fashion-MNIST (Debian package dataset-fashion-mnist) as image patches for a
// Transformer classifier: a 28x28 image with patch size p is a sequence of
// P = (28/p)^2 patches in row-major patch order, each patch's p*p pixels
// row-major, pixel = (byte/255 - kFashionMean) / kFashionStd.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/idx_file.h"

namespace dtrain::data {

inline constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
inline constexpr int kFashionClasses = 10;
inline constexpr float kFashionMean = 0.2860f;
inline constexpr float kFashionStd = 0.3530f;

class FashionMnistDataset final : public Dataset {
 public:
  // Takes the decoded images and labels. Throws DataError naming `name` when
  // their counts differ or a label is >= 10, ConfigError("model.patch_size")
  // when patch_size does not divide the image sides.
  FashionMnistDataset(IdxImages images, std::vector<uint8_t> labels, int patch_size,
                      std::string name);

  // Loads `split` ("train" or "t10k") from `dir`: {split}-images-idx3-ubyte.gz
  // and {split}-labels-idx1-ubyte.gz. A missing file's IoError names the path
  // and says `apt-get install dataset-fashion-mnist`.
  static std::shared_ptr<FashionMnistDataset> open(const std::string& dir, const std::string& split,
                                                   int patch_size);

  int64_t size() const override { return images_.count; }
  void fill(int64_t index, Batch& batch, int row) const override;

  uint8_t label(int64_t index) const { return labels_[static_cast<std::size_t>(index)]; }

 private:
  IdxImages images_;
  std::vector<uint8_t> labels_;
  float normalized_[256];  // byte -> normalized pixel
};

}  // namespace dtrain::data
