// bf16 / f16 conversions (core/dtype.h, nn/cpu/convert.h): round to nearest
// even, inf and NaN kept, overflow to inf, subnormals kept; the bulk
// conversions agree bit for bit with the per-element ones.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "nn/cpu/convert.h"

namespace dtrain {
namespace {

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

TEST(Bf16, RoundTripsEveryBf16Value) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = bf16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_bf16(f), h) << std::hex << h;
  }
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties go to the even (1).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000u)), 0x3F80u);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000u)), 0x3F82u);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001u)), 0x3F81u);  // above half: up
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFFu)), 0x3F80u);  // below half: down
}

TEST(Bf16, InfNanOverflowAndSubnormals) {
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::infinity()), 0x7F80u);
  EXPECT_EQ(f32_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80u);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits must not become inf.
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(from_bits(0x7F800001u)))));
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80u);  // rounds up to inf
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000u)), 0x0001u);  // smallest bf16 subnormal
  EXPECT_EQ(bf16_to_f32(0x0001u), from_bits(0x00010000u));
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000u);
}

TEST(F16, RoundTripsEveryF16Value) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << h;
  }
}

TEST(F16, RoundingInfNanOverflowAndSubnormals) {
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00u);            // tie to even: down
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02u);        // tie to even: up
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFFu);                    // largest finite
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00u);                    // rounds to inf
  EXPECT_EQ(f32_to_f16(1e6f), 0x7C00u);
  EXPECT_EQ(f32_to_f16(-std::numeric_limits<float>::infinity()), 0xFC00u);
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(f32_to_f16(0x1p-24f), 0x0001u);                    // smallest subnormal
  EXPECT_EQ(f16_to_f32(0x0001u), 0x1p-24f);
  EXPECT_EQ(f32_to_f16(0x1p-26f), 0x0000u);                    // below half of it: 0
}

TEST(BulkConversion, MatchesTheScalarRulesBitForBit) {
  std::vector<float> src;
  for (std::uint32_t i = 0; i < 200000; ++i) src.push_back(from_bits(i * 21473u + 12345u));
  for (DType t : {DType::bf16, DType::f16}) {
    std::vector<std::uint16_t> half(src.size());
    nn::cpu::f32_to_half(src.data(), t, half.data(), static_cast<std::int64_t>(src.size()));
    std::vector<float> back(src.size(), 1.0f);
    nn::cpu::half_to_f32(half.data(), t, back.data(), static_cast<std::int64_t>(src.size()));
    nn::cpu::add_half_to_f32(half.data(), t, back.data(), static_cast<std::int64_t>(src.size()));
    for (std::size_t i = 0; i < src.size(); ++i) {
      const std::uint16_t want = t == DType::bf16 ? f32_to_bf16(src[i]) : f32_to_f16(src[i]);
      const float wide = t == DType::bf16 ? bf16_to_f32(want) : f16_to_f32(want);
      ASSERT_EQ(half[i], want) << dtype_name(t) << " element " << i;
      if (!std::isnan(wide)) {
        ASSERT_EQ(back[i], wide + wide) << dtype_name(t) << " element " << i;
      }
    }
  }
}

// store_all takes blocks of 16 (bf16, a native build: the AVX512-BF16
// conversion): blocks of normal numbers with every special the rule treats
// apart (NaN payloads, signs, infinities, overflow to inf, ties) and blocks
// where one zero or subnormal sends the block to the rule, then a tail.
TEST(BulkConversion, BlocksOfSixteenKeepTheRuleForEverySpecialValue) {
  const std::vector<std::uint32_t> specials = {
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xffffffffu, 0x7fffffffu, 0x7fbfffffu,  // NaNs
      0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u,              // inf, overflow
      0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x00800000u, 0x80800000u};             // ties, smallest normals
  const std::vector<std::uint32_t> tiny = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x007f8000u};
  std::vector<float> src;
  for (std::uint32_t bits : specials) src.push_back(from_bits(bits));  // one all-normal block
  for (std::uint32_t t : tiny) {  // each tiny value inside an otherwise normal block
    for (std::size_t i = 0; i < 16; ++i) src.push_back(from_bits(i == 7 ? t : specials[i]));
  }
  for (std::uint32_t bits : specials) src.push_back(from_bits(bits ^ 0x80000000u));  // signs flipped
  for (std::uint32_t t : tiny) src.push_back(from_bits(t));                          // a tail of 5
  std::vector<std::uint16_t> got(src.size());
  nn::cpu::store_all<nn::cpu::Bf16Format>(src.data(), got.data(), static_cast<std::int64_t>(src.size()));
  for (std::size_t i = 0; i < src.size(); ++i) {
    EXPECT_EQ(got[i], f32_to_bf16(src[i])) << "element " << i << " bits " << std::hex << std::bit_cast<std::uint32_t>(src[i]);
  }
}

}  // namespace
}  // namespace dtrain
