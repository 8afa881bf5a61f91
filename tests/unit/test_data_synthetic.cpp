// Synthetic tasks: deterministic, random access, learnable; and make_datasets'
// config validation for them.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "data/datasets.h"
#include "data/synthetic.h"

namespace dtrain::data {
namespace {

std::vector<int32_t> lm_row(const Dataset& ds, int64_t window) {
  Batch b = make_batch(ds.info(), 1);
  ds.fill(window, b, 0);
  std::vector<int32_t> row = b.tokens;
  row.push_back(b.targets.back());
  return row;
}

TEST(SyntheticLm, DeterministicRandomAccessAndShiftedTargets) {
  SyntheticLmDataset a(10000, 32, 256, 1, "a");
  SyntheticLmDataset b(10000, 32, 256, 1, "b");
  SyntheticLmDataset other_seed(10000, 32, 256, 2, "c");
  EXPECT_EQ(a.size(), (10000 - 1) / 32);
  EXPECT_EQ(lm_row(a, 17), lm_row(b, 17));
  EXPECT_NE(lm_row(a, 17), lm_row(other_seed, 17));
  Batch batch = make_batch(a.info(), 2);
  a.fill(5, batch, 1);
  for (int t = 0; t < 32; ++t) {
    EXPECT_EQ(batch.tokens[32 + t], a.token_at(5 * 32 + t));
    EXPECT_EQ(batch.targets[32 + t], a.token_at(5 * 32 + t + 1));
    EXPECT_GE(batch.tokens[32 + t], 0);
    EXPECT_LT(batch.tokens[32 + t], 256);
  }
  // Consecutive windows share their boundary token.
  EXPECT_EQ(lm_row(a, 3).back(), lm_row(a, 4).front());
}

TEST(SyntheticLm, StreamIsLearnableButNotTrivial) {
  // Empirical entropies over the whole stream: the next token given the
  // previous one is far more predictable than ln(V), yet tokens cover the
  // vocabulary (a constant predictor does not work).
  const int V = 256;
  SyntheticLmDataset ds(1 << 18, 256, V, 3, "lm");
  std::vector<double> bigram(static_cast<std::size_t>(V) * V, 0.0);
  std::vector<double> unigram(V, 0.0);
  Batch b = make_batch(ds.info(), 1);
  for (int64_t w = 0; w < ds.size(); ++w) {
    ds.fill(w, b, 0);
    for (int t = 0; t < 256; ++t) {
      bigram[static_cast<std::size_t>(b.tokens[t]) * V + b.targets[t]] += 1;
      unigram[b.targets[t]] += 1;
    }
  }
  double total = 0, h_uni = 0, h_cond = 0;
  for (double c : unigram) total += c;
  for (double c : unigram) {
    if (c > 0) h_uni -= c / total * std::log(c / total);
  }
  for (int prev = 0; prev < V; ++prev) {
    double row = 0;
    for (int next = 0; next < V; ++next) row += bigram[prev * V + next];
    for (int next = 0; next < V; ++next) {
      const double c = bigram[prev * V + next];
      if (c > 0) h_cond -= c / total * std::log(c / row);
    }
  }
  EXPECT_GT(h_uni, 0.95 * std::log(V));
  EXPECT_LT(h_cond, 1.0);  // about 0.74 + ln(256)/64 = 0.83 nats
}

TEST(SyntheticClassifier, LabelsDeterministicAndBalanced) {
  SyntheticClassifierDataset ds(10000, 0, 16, 64, 10, 7, "cls");
  SyntheticClassifierDataset again(10000, 0, 16, 64, 10, 7, "cls");
  std::map<int32_t, int> counts;
  for (int64_t i = 0; i < ds.size(); ++i) {
    ASSERT_EQ(ds.label(i), again.label(i));
    counts[ds.label(i)]++;
  }
  ASSERT_EQ(counts.size(), 10u);
  for (const auto& [label, n] : counts) {
    EXPECT_GE(label, 0);
    EXPECT_LT(label, 10);
    EXPECT_NEAR(n, 1000, 150) << "label " << label;
  }
}

TEST(SyntheticClassifier, ClassTokensMakeItLinearlySeparable) {
  // Counting tokens per residue class (a linear function of mean-pooled
  // one-hot embeddings) must predict the label almost always.
  const int C = 10, V = 256, T = 64;
  SyntheticClassifierDataset ds(4000, 0, T, V, C, 5, "cls");
  Batch b = make_batch(ds.info(), 1);
  int correct = 0;
  double class_token_share = 0;
  for (int64_t i = 0; i < ds.size(); ++i) {
    ds.fill(i, b, 0);
    ASSERT_EQ(b.targets[0], ds.label(i));
    std::vector<int> per_class(C, 0);
    for (int t = 0; t < T; ++t) {
      ASSERT_GE(b.tokens[t], 0);
      ASSERT_LT(b.tokens[t], V);
      per_class[b.tokens[t] % C]++;
    }
    const int guess =
        static_cast<int>(std::max_element(per_class.begin(), per_class.end()) - per_class.begin());
    correct += guess == b.targets[0];
    class_token_share += static_cast<double>(per_class[b.targets[0]]) / T;
  }
  EXPECT_GE(correct, 0.99 * ds.size());
  // ~50% drawn from the class plus ~50% * 1/C by chance.
  EXPECT_NEAR(class_token_share / ds.size(), 0.50 + 0.50 / C, 0.03);
}

TEST(SyntheticClassifier, ValidationIsADisjointIndexRange) {
  DataSpec spec{.kind = "synthetic",
                .seq_len = 12,
                .vocab_size = 50,
                .num_classes = 5,
                .model_kind = "classifier",
                .seed = 9,
                .synthetic_train_size = 300,
                .synthetic_val_size = 40};
  const DatasetPair pair = make_datasets(spec);
  EXPECT_EQ(pair.train->size(), 300);
  EXPECT_EQ(pair.val->size(), 40);
  // Validation example i is example 300 + i of the same generator.
  SyntheticClassifierDataset longer(400, 0, 12, 50, 5, 9, "longer");
  Batch v = make_batch(pair.val->info(), 1);
  Batch l = make_batch(longer.info(), 1);
  Batch t = make_batch(longer.info(), 1);
  pair.val->fill(7, v, 0);
  longer.fill(307, l, 0);
  longer.fill(7, t, 0);
  EXPECT_EQ(v.tokens, l.tokens);
  EXPECT_EQ(v.targets, l.targets);
  EXPECT_NE(v.tokens, t.tokens);
}

template <typename F>
std::string config_field_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.field();
  }
  return "(no ConfigError)";
}

TEST(MakeDatasets, ValidationErrorsNameTheConfigField) {
  DataSpec lm{.kind = "synthetic", .seq_len = 64, .vocab_size = 128, .model_kind = "lm"};
  EXPECT_EQ(make_datasets(lm).train->info().vocab_size, 128);

  DataSpec bad = lm;
  bad.kind = "parquet";
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "data.kind");
  bad = lm;
  bad.seq_len = 0;
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "data.seq_len");
  bad = lm;
  bad.synthetic_val_size = 10;  // fewer tokens than one window
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "data.seq_len");
  bad = lm;
  bad.model_kind = "classifier";
  bad.num_classes = 300;
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "model.vocab_size");
  bad.num_classes = 1;
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "model.num_classes");
  bad = lm;
  bad.model_kind = "vision";
  EXPECT_EQ(config_field_of([&] { make_datasets(bad); }), "model.kind");

  DataSpec fashion{.kind = "fashion_mnist",
                   .path = "no-such-dir",
                   .num_classes = 10,
                   .patch_size = 5,
                   .model_kind = "classifier"};
  EXPECT_EQ(config_field_of([&] { make_datasets(fashion); }), "model.patch_size");
  fashion.num_classes = 7;
  EXPECT_EQ(config_field_of([&] { make_datasets(fashion); }), "model.num_classes");
  fashion.num_classes = 10;
  fashion.model_kind = "lm";
  EXPECT_EQ(config_field_of([&] { make_datasets(fashion); }), "model.kind");
}

}  // namespace
}  // namespace dtrain::data
