// The few libtorch entry points tch does not expose, behind a C ABI. Kept minimal: the logic
// lives in Rust. Every function catches C++ exceptions and reports them via shim_last_error().
#include <ATen/autocast_mode.h>
#include <c10/core/ScalarType.h>

#include <exception>
#include <string>

namespace {
thread_local std::string last_error;

template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    last_error = e.what();
  } catch (...) {
    last_error = "unknown C++ exception";
  }
  return -1;
}

at::DeviceType device_type(int cuda) { return cuda ? at::kCUDA : at::kCPU; }
}  // namespace

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
