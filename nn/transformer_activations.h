// Private to nn/transformer*.cpp: the activations a Transformer keeps for
// backward and the scratch its backward shares across layers, in host memory
// (nn/transformer_buffers.h declares them for both devices).
#pragma once

#include "core/aligned_buffer.h"
#include "nn/transformer.h"
#include "nn/transformer_buffers.h"

namespace dtrain::nn {

struct Transformer::Activations : ActivationBuffers<AlignedBuffer> {
  using ActivationBuffers::ActivationBuffers;
};

struct Transformer::HalfActivations : HalfActivationBuffers<AlignedBuffer> {
  using HalfActivationBuffers::HalfActivationBuffers;
};

}  // namespace dtrain::nn
