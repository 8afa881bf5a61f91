// GELU with the exact erf form: gelu(x) = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)).
// Forward also writes the derivative gelu'(x) = Phi(x) + x phi(x), which it
// gets almost for free from the same erf, so that backward is one multiply and
// the pre-activation need not be kept. Storage in format F (f32 or 16-bit),
// arithmetic in f32.
#pragma once

#include <cstdint>

#include "nn/cpu/convert.h"
#include "nn/gelu_form.h"

namespace dtrain::nn {

// x, y, dydx: [n]. y = gelu(x); dydx = gelu'(x) (null skips it). dydx may
// alias x (the pre-activation is overwritten by its derivative); y may not.
// form: the erf form or GPT-2's tanh approximation (nn/gelu_form.h).
template <class F = cpu::F32Format>
void gelu_forward(const typename F::T* x, typename F::T* y, typename F::T* dydx, std::int64_t n,
                  GeluForm form = GeluForm::erf);

// dy, dydx, dx: [n, c], rows ld apart (0: c). dx = dy * dydx, with dydx from
// gelu_forward; dx may alias dy. dbias: [c] or null; when given, the column
// sums of dx (f32, before dx is rounded to F) are added to it: the gradient of
// the bias of the linear layer that produced the GELU's input, in the same
// pass over dx. Columns c..ld of each row are neither read nor written.
template <class F = cpu::F32Format>
void gelu_backward(const typename F::T* dy, const typename F::T* dydx, typename F::T* dx, float* dbias,
                   std::int64_t n, std::int64_t c, std::int64_t ld = 0);

}  // namespace dtrain::nn
