// The parameter layout of a model: every parameter in a fixed declaration
// order, grouped into blocks (embeddings, each Transformer layer, the head).
// Each block's parameters are packed into one flat f32 range, in declaration
// order; the model never owns that memory: whoever holds the flat buffers
// (ParameterStore here, the sharding engine under data parallelism) hands
// the model one base pointer per block.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"

namespace dtrain::nn {

enum class Init : std::uint8_t { normal, zeros, ones };

struct ParamSpec {
  std::string name;                  // "layer.3.fc1.weight"
  std::vector<std::int64_t> shape;   // PyTorch convention: Linear weight is [out, in]
  Init init = Init::normal;
  bool decay = false;                // AdamW weight decay applies (matrices, embeddings)
  int block = 0;
  std::int64_t offset = 0;           // element offset inside its block's flat range
  std::int64_t numel = 0;
};

struct BlockSpec {
  std::string name;                  // "embeddings", "layer.3", "head"
  std::int64_t numel = 0;
  int first_param = 0;
  int num_params = 0;
};

class ParameterLayout {
 public:
  // Declares the next parameter in the current block (begin_block first).
  void begin_block(std::string name);
  int add(std::string name, std::vector<std::int64_t> shape, Init init, bool decay);

  const std::vector<ParamSpec>& params() const { return params_; }
  const std::vector<BlockSpec>& blocks() const { return blocks_; }
  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  std::int64_t total_numel() const { return total_; }
  // Element offset of block b in a buffer that holds all blocks back to back.
  std::int64_t block_offset(int b) const { return block_offsets_[static_cast<std::size_t>(b)]; }
  const ParamSpec& find(const std::string& name) const;

 private:
  std::vector<ParamSpec> params_;
  std::vector<BlockSpec> blocks_;
  std::vector<std::int64_t> block_offsets_;
  std::int64_t total_ = 0;
};

// Deterministic initialisation of one parameter (N(0, 0.02), zeros or ones).
// The values depend only on (seed, the parameter's index in the layout), not
// on where the parameter is stored, so any sharding initialises identically.
void init_parameter(const ParamSpec& spec, int index, std::uint64_t seed, float* data);

// Per-block base pointers into flat memory: what a model binds to.
struct BlockPointers {
  std::vector<float*> params;  // params[b] -> block b's flat parameters
  std::vector<float*> grads;   // grads[b]  -> block b's flat gradients (accumulated into)
  // Mixed precision: compute[b] -> a 16-bit copy of block b's parameters (same
  // layout), refreshed by the owner after every update; empty in fp32.
  std::vector<const std::uint16_t*> compute;
  // weights_version[b]: the version of block b's values (which params[b] and
  // compute[b] hold whenever a product of block b reads them). The owner
  // stores a new next_weights_version() for every block after every change,
  // before any product that reads the new values is submitted, so that
  // matmuls may keep weights in another layout until it changes
  // (cpu::gemm_weights). No two blocks share a version: ZeRO-3 gathers block
  // after block into the same slot, and the copies tell them apart by it.
  // Null: no promise, the matmuls read the weights as stored every time.
  const std::uint64_t* weights_version = nullptr;
};

// A version no call has returned before in this process (never 0): owners of
// different parameters at the same address never share one.
std::uint64_t next_weights_version();

// Single-process owner of all flat buffers: parameters, gradients and the
// AdamW moments, each one allocation with the blocks back to back.
class ParameterStore {
 public:
  ParameterStore(const ParameterLayout& layout, std::uint64_t seed);

  BlockPointers pointers();
  std::span<float> params() { return params_.span(); }
  std::span<float> grads() { return grads_.span(); }
  std::span<float> exp_avg() { return exp_avg_.span(); }
  std::span<float> exp_avg_sq() { return exp_avg_sq_.span(); }
  const ParameterLayout& layout() const { return layout_; }
  void zero_grads();

 private:
  const ParameterLayout& layout_;
  AlignedBuffer<float> params_, grads_, exp_avg_, exp_avg_sq_;
};

}  // namespace dtrain::nn
