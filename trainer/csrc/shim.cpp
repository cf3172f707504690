// The few libtorch entry points tch does not expose, behind a C ABI. Kept minimal: the logic
// lives in Rust. Every function catches C++ exceptions and reports them via shim_last_error()
// (guarded.h).
#include <ATen/autocast_mode.h>
#include <c10/core/ScalarType.h>

#include <exception>
#include <string>

#include "guarded.h"

namespace {
thread_local std::string last_error;
using scdino_shim::guarded;

at::DeviceType device_type(int cuda) { return cuda ? at::kCUDA : at::kCPU; }
}  // namespace

// The one error slot of every shim file (guarded.h), behind shim_last_error().
namespace scdino_shim {
void set_last_error(const char* message) { last_error = message; }
}  // namespace scdino_shim

extern "C" {

const char* shim_last_error() { return last_error.c_str(); }

// Enters an autocast region for CPU (cuda=0) or CUDA (cuda=1) with dtype bf16 (bf16=1) or
// fp16 (bf16=0), as torch.autocast.__enter__ does. Returns the previous enabled flag (0/1),
// or -1 on error.
int shim_autocast_enter(int cuda, int bf16) {
  int previous = 0;
  int rc = guarded([&] {
    auto dev = device_type(cuda);
    previous = at::autocast::is_autocast_enabled(dev) ? 1 : 0;
    at::autocast::set_autocast_enabled(dev, true);
    at::autocast::set_autocast_dtype(dev, bf16 ? at::kBFloat16 : at::kHalf);
    at::autocast::increment_nesting();
  });
  return rc == 0 ? previous : -1;
}

// Leaves the region, restoring the previous flag; clears the cast cache at the outermost exit.
int shim_autocast_exit(int cuda, int previous) {
  return guarded([&] {
    auto dev = device_type(cuda);
    at::autocast::set_autocast_enabled(dev, previous != 0);
    if (at::autocast::decrement_nesting() == 0) {
      at::autocast::clear_cache();
    }
  });
}
}

// ---- Autograd extras for overlapped DDP and FSDP (platform-notes §4.6) ----------------------
#include <ATen/native/Resize.h>
#ifdef SCDINO_NCCL
// Declared by hand: ATen/native/cuda/Resize.h does not compile outside nvcc with torch 2.13's
// headers (its inline resize_impl_cuda_ compares IntArrayRef with OptionalIntArrayRef). The
// symbol is exported by libtorch_cuda, which the nccl feature links.
namespace at::native {
void resize_bytes_cuda(c10::StorageImpl* storage, size_t size_bytes);
}
#endif
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdint>
#include <memory>

// `grad` is NULL for post-accumulate hooks (the gradient is then in the tensor's .grad).
typedef void (*tchx_grad_cb)(void* ctx, int64_t idx, at::Tensor* grad);

namespace {
struct PostAccumulate : torch::autograd::PostAccumulateGradHook {
  tchx_grad_cb cb;
  void* ctx;
  int64_t idx;
  PostAccumulate(tchx_grad_cb c, void* x, int64_t i) : cb(c), ctx(x), idx(i) {}
  void operator()(const torch::autograd::Variable&) override { cb(ctx, idx, nullptr); }
};
}  // namespace

extern "C" {

// Calls cb(ctx, idx, &grad) each time the gradient with respect to `t` is computed (before a
// leaf accumulates it into .grad; for a non-leaf, before its grad_fn runs). Returns the hook
// handle for tchx_remove_grad_hook, or -1 on error (e.g. `t` does not require grad).
int64_t tchx_register_grad_hook(at::Tensor* t, tchx_grad_cb cb, void* ctx, int64_t idx) {
  int64_t handle = -1;
  int rc = guarded([&] {
    handle = t->register_hook([cb, ctx, idx](const at::Tensor& grad) {
      at::Tensor g = grad;
      cb(ctx, idx, &g);
    });
  });
  return rc == 0 ? handle : -1;
}

int tchx_remove_grad_hook(at::Tensor* t, int64_t handle) {
  return guarded([&] { t->remove_hook(static_cast<unsigned>(handle)); });
}

// Calls cb(ctx, idx, NULL) after a leaf's gradient has been accumulated into .grad (one such
// hook per tensor; registering replaces it, cb == NULL removes it).
int tchx_set_post_accumulate_hook(at::Tensor* t, tchx_grad_cb cb, void* ctx, int64_t idx) {
  return guarded([&] {
    torch::autograd::impl::set_post_acc_grad_hooks(
        *t, cb ? std::make_unique<PostAccumulate>(cb, ctx, idx) : nullptr);
  });
}

// t.grad = g (g == NULL: no gradient, freeing the old one).
int tchx_set_grad(at::Tensor* t, at::Tensor* g) {
  return guarded([&] { t->mutable_grad() = g ? *g : at::Tensor(); });
}

// Resizes the storage under `t` (and every view of it) to `nbytes`, keeping sizes and strides,
// as FSDP's `_free_storage`/`_alloc_storage`: 0 frees the memory, the full size reallocates it
// (contents undefined until written).
int tchx_resize_storage(at::Tensor* t, int64_t nbytes) {
  return guarded([&] {
    auto* storage = t->storage().unsafeGetStorageImpl();
    if (t->device().is_cpu()) {
      at::native::resize_bytes_cpu(storage, static_cast<size_t>(nbytes));
    } else {
#ifdef SCDINO_NCCL
      at::native::resize_bytes_cuda(storage, static_cast<size_t>(nbytes));
#else
      at::native::resize_bytes_nocuda(t->storage(), c10::SymInt(nbytes));
#endif
    }
  });
}

// Bytes of the storage under `t` (what it actually holds, whatever its sizes claim); -1 if
// it has none.
int64_t tchx_storage_nbytes(at::Tensor* t) {
  if (!t->defined() || !t->has_storage()) return -1;
  return static_cast<int64_t>(t->storage().nbytes());
}
}

// ---- Build information for `trainer --version` ----------------------------------------------
// Versions compiled into the libtorch this binary loads (the headers it was built against for
// torch itself); none of them needs a GPU or a driver, so an image can be checked offline.
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/headeronly/version.h>
#ifdef SCDINO_NCCL
// Declared by hand: torch/csrc/cuda/nccl.h pulls in ATen/cuda headers; libtorch_cuda exports it.
namespace torch::cuda::nccl {
std::uint64_t version();
}
#endif

extern "C" {

const char* shim_torch_version() { return TORCH_VERSION; }

// CUDART_VERSION libtorch_cuda was built with (13000 for 13.0); -1 where libtorch_cuda is not
// loaded (the build without the nccl feature), as the hooks then are the CPU stub.
int64_t shim_cuda_build_version() {
  int64_t v = -1;
  guarded([&] { v = at::detail::getCUDAHooks().versionCUDART(); });
  return v;
}

// CUDNN_VERSION libtorch_cuda was built with (91500 for 9.15.0); -1 as above.
int64_t shim_cudnn_build_version() {
  int64_t v = -1;
  guarded([&] { v = at::detail::getCUDAHooks().versionCuDNN(); });
  return v;
}

// NCCL libtorch_cuda was built with, as (major << 32) | (minor << 16) | patch; 0 without the
// nccl feature (libtorch_cuda is then not linked).
uint64_t shim_nccl_build_version() {
#ifdef SCDINO_NCCL
  return torch::cuda::nccl::version();
#else
  return 0;
#endif
}
}
