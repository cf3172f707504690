// The one way every shim file (csrc/*.cpp) turns a C++ exception into a C return code: a C++
// exception must not unwind into Rust, so each `extern "C"` function runs its body through
// `guarded`, which returns 0, or -1 with the message kept behind `shim_last_error()`
// (shim.cpp owns the thread-local slot, so Rust reads every file's errors in one place).
#pragma once

#include <exception>

namespace scdino_shim {
void set_last_error(const char* message);

template <typename F>
int guarded(F f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    set_last_error(e.what());
  } catch (...) {
    set_last_error("unknown C++ exception");
  }
  return -1;
}
}  // namespace scdino_shim
