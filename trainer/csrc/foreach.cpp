// Multi-tensor (`_foreach_*`) versions of the step's per-parameter loops, which tch does not
// bind: AdamW, the teacher EMA, scDINO's per-parameter clipping and the fp16 unscale. On a
// GPU each list op is a handful of kernel launches for all ~150 parameters instead of several
// per parameter; on CPU libtorch runs the same ops tensor by tensor, so the numbers are the
// same on both. The op order is PyTorch's `_multi_tensor_adam` (decoupled weight decay,
// capturable=False), the implementation `torch.optim.AdamW` picks by default on CUDA.
//
// Tensors arrive as arrays of `at::Tensor*` (tch's C handles). Every function catches C++
// exceptions and reports them through shim_last_error() (guarded.h).
#include <ATen/ATen.h>
#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_foreach_sub.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "guarded.h"

namespace {
using scdino_shim::guarded;

std::vector<at::Tensor> list(at::Tensor** ts, int64_t n) {
  std::vector<at::Tensor> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out.push_back(*ts[i]);
  return out;
}
}  // namespace

extern "C" {

// One AdamW step over n parameters of one weight-decay group. `steps[i]` is parameter i's
// update count including this one (PyTorch keeps one per parameter; the caller increments).
int tchx_foreach_adamw(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                       at::Tensor** exp_avg_sqs, const double* steps, int64_t n, double lr,
                       double weight_decay, double beta1, double beta2, double eps) {
  return guarded([&] {
    if (n == 0) return;
    auto p = list(params, n);
    auto g = list(grads, n);
    auto m = list(exp_avgs, n);
    auto v = list(exp_avg_sqs, n);
    if (weight_decay != 0.0) at::_foreach_mul_(p, 1.0 - lr * weight_decay);
    at::_foreach_lerp_(m, g, 1.0 - beta1);
    at::_foreach_mul_(v, beta2);
    at::_foreach_addcmul_(v, g, g, 1.0 - beta2);
    std::vector<at::Scalar> step_size;
    std::vector<at::Scalar> bias_correction2_sqrt;
    step_size.reserve(static_cast<size_t>(n));
    bias_correction2_sqrt.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      // Python floats: `1 - beta ** step`, `(lr / bc) * -1`, `bc ** 0.5`.
      double bc1 = 1.0 - std::pow(beta1, steps[i]);
      double bc2 = 1.0 - std::pow(beta2, steps[i]);
      step_size.emplace_back((lr / bc1) * -1.0);
      bias_correction2_sqrt.emplace_back(std::pow(bc2, 0.5));
    }
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, bias_correction2_sqrt);
    at::_foreach_add_(denom, eps);
    at::_foreach_addcdiv_(p, m, denom, step_size);
  });
}

// Teacher EMA as scDINO writes it, `t.mul_(m).add_((1 - m) * s)`: the product is rounded
// before the add (DINOv2's `_foreach_add_(t, s, alpha=1 - m)` fuses it and rounds once, which
// drifts from scDINO's numbers over a run).
int tchx_foreach_ema(at::Tensor** teacher, at::Tensor** student, int64_t n, double momentum) {
  return guarded([&] {
    if (n == 0) return;
    auto t = list(teacher, n);
    auto s = list(student, n);
    at::_foreach_mul_(t, momentum);
    at::_foreach_add_(t, at::_foreach_mul(s, 1.0 - momentum));
  });
}

// scDINO's per-parameter clipping: each gradient scaled to norm ≤ clip on its own. The norms
// before clipping (fp32, one per gradient) are written into `norms_out` (a new 1-D tensor,
// left on the gradients' device so reading them is the caller's one sync).
int tchx_foreach_clip(at::Tensor** grads, int64_t n, double clip, at::Tensor** norms_out) {
  return guarded([&] {
    auto g = list(grads, n);
    auto norms = at::stack(at::_foreach_norm(g), 0);
    // Python: clip / (norm + 1e-6) = reciprocal(norm + 1e-6) · clip; applied where < 1.
    auto coef = (norms + 1e-6).reciprocal() * clip;
    coef = at::where(coef.lt(1.0), coef, at::ones_like(coef));
    at::_foreach_mul_(g, coef.unbind(0));
    *norms_out = new at::Tensor(norms);
  });
}

// GradScaler.unscale_: every gradient multiplied by inv_scale (a 1-element fp32 tensor);
// found_inf (a 1-element fp32 tensor, zero on entry) becomes 1 if any value is inf or NaN.
int tchx_foreach_unscale(at::Tensor** grads, int64_t n, at::Tensor* found_inf,
                         at::Tensor* inv_scale) {
  return guarded([&] {
    if (n == 0) return;
    auto g = list(grads, n);
    at::_amp_foreach_non_finite_check_and_unscale_(g, *found_inf, *inv_scale);
  });
}

// The AdamW step of tchx_foreach_adamw with every per-step value read from device tensors, so
// that a CUDA graph capturing it replays with this step's values (no host scalar is baked in):
// `decay` is the 0-d fp32 factor `1 - lr * weight_decay` (1 for the plain group); `step_size`
// (`-lr / (1 - beta1^t)`) and `bc2_sqrt` (`sqrt(1 - beta2^t)`) hold one fp32 value per
// parameter, filled by the caller before each step. Op order of PyTorch's capturable
// `_multi_tensor_adam`: the denominator is divided by the step size and added with value 1.
int tchx_foreach_adamw_dev(at::Tensor** params, at::Tensor** grads, at::Tensor** exp_avgs,
                           at::Tensor** exp_avg_sqs, int64_t n, at::Tensor* decay,
                           at::Tensor* step_size, at::Tensor* bc2_sqrt, double beta1,
                           double beta2, double eps) {
  return guarded([&] {
    if (n == 0) return;
    auto p = list(params, n);
    auto g = list(grads, n);
    auto m = list(exp_avgs, n);
    auto v = list(exp_avg_sqs, n);
    at::_foreach_mul_(p, *decay);
    at::_foreach_lerp_(m, g, 1.0 - beta1);
    at::_foreach_mul_(v, beta2);
    at::_foreach_addcmul_(v, g, g, 1.0 - beta2);
    auto steps = step_size->unbind(0);
    auto bc2 = bc2_sqrt->unbind(0);
    auto denom = at::_foreach_sqrt(v);
    at::_foreach_div_(denom, bc2);
    at::_foreach_add_(denom, eps);
    at::_foreach_div_(denom, steps);
    at::_foreach_addcdiv_(p, m, denom);
  });
}

// tchx_foreach_ema with the momentum in device tensors (`momentum` = m, `rest` = 1 - m, both
// 0-d fp32 rounded from the host's double), the same arithmetic as the Scalar version.
int tchx_foreach_ema_dev(at::Tensor** teacher, at::Tensor** student, int64_t n,
                         at::Tensor* momentum, at::Tensor* rest) {
  return guarded([&] {
    if (n == 0) return;
    auto t = list(teacher, n);
    auto s = list(student, n);
    at::_foreach_mul_(t, *momentum);
    at::_foreach_add_(t, at::_foreach_mul(s, *rest));
  });
}
}
