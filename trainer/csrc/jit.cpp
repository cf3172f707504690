// TorchScript modules tch cannot build: a traced module wrapped in a scripted one whose
// `forward` checks its input before calling the traced graph. A trace records only tensor
// operations, so a shape check written in Rust would be gone from the saved graph, and a
// `[B, 1, H, W]` input would broadcast against the baked `[1, C, 1, 1]` mean; TorchScript
// source compiled here keeps the check (and its message) inside the module.
#include <torch/script.h>

#include "guarded.h"

extern "C" {

// Loads the traced module at `traced_path`, registers it as submodule `inner_name` of a new
// module of class `class_name`, compiles `source` (TorchScript methods referring to
// `self.<inner_name>`) into it and saves it to `out_path`. 0 on success, -1 with
// shim_last_error() set otherwise.
int shim_jit_wrap(const char* traced_path, const char* class_name, const char* inner_name,
                  const char* source, const char* out_path) {
  return scdino_shim::guarded([&] {
    torch::jit::Module inner = torch::jit::load(traced_path);
    inner.eval();
    torch::jit::Module outer(class_name);
    // Every module Python scripts has it; `model.eval()` in Python sets it on each submodule.
    outer.register_attribute("training", c10::BoolType::get(), false);
    outer.register_module(inner_name, inner);
    outer.define(source);
    outer.save(out_path);
  });
}
}
