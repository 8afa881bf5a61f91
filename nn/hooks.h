// Per-block hooks (docs/ARCHITECTURE.md): a model calls them around each block so that
// the engine that owns the flat buffers can act on block boundaries. DDP starts
// a bucket's all-reduce in after_backward (the block's gradients are final);
// ZeRO-3 gathers a block's parameters in before_* and releases them in after_*.
// Called on the training thread, in block order for forward (0..n-1) and in
// reverse for backward (n-1..0).
#pragma once

namespace dtrain::nn {

class BlockHooks {
 public:
  virtual ~BlockHooks() = default;
  virtual void before_forward(int /*block*/) {}
  virtual void after_forward(int /*block*/) {}
  virtual void before_backward(int /*block*/) {}
  virtual void after_backward(int /*block*/) {}
};

}  // namespace dtrain::nn
