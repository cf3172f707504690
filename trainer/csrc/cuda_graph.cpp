// libtorch's CUDA graphs (at::cuda::CUDAGraph) and side streams behind a C ABI; tch binds
// neither. Built with CUDA only where the CUDA headers are (`--features cuda`, which `nccl`
// implies: SCDINO_CUDA); elsewhere every function fails with "built without CUDA", so the
// Rust side links the same symbols in every build and says why it cannot capture.
//
// The sequence PyTorch's `torch.cuda.graph` runs: device synchronize, capture on a side stream
// (capture on the legacy default stream is refused), end the capture on that stream, go back
// to the caller's stream, which waits for the side stream's work. Capture mode is
// thread-local, not global: the trainer's loader threads may allocate pinned memory or copy to
// the GPU while the step is captured, which global mode would turn into a capture error; the
// autograd engine's worker thread launches its kernels onto the capturing stream as usual.
#include <exception>
#include <string>

#include "guarded.h"

#ifdef SCDINO_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/core/Event.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

namespace {
using scdino_shim::guarded;

// `waiter` waits for the work queued on `first` so far, through c10's device-generic event
// (CUDAEvent moved from ATen to c10 between the torch releases this builds against, and a
// direct CUDA runtime call would need libcudart on the link line).
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& first) {
  c10::Event event(c10::DeviceType::CUDA);
  event.record(first.unwrap());
  event.block(waiter.unwrap());
}

// The caller's stream and the side stream work runs on until `leave`.
struct SideStream {
  c10::cuda::CUDAStream previous;
  c10::cuda::CUDAStream side;

  explicit SideStream(c10::DeviceIndex device)
      : previous(c10::cuda::getCurrentCUDAStream(device)),
        side(c10::cuda::getStreamFromPool(false, device)) {
    wait_for(side, previous);
    c10::cuda::setCurrentCUDAStream(side);
  }

  void leave() {
    wait_for(previous, side);
    c10::cuda::setCurrentCUDAStream(previous);
  }
};

struct Graph {
  at::cuda::CUDAGraph graph;
  SideStream stream;
  bool capturing = false;

  explicit Graph(c10::DeviceIndex device) : stream(device) {}
};
}  // namespace

extern "C" {

int tchx_cuda_available_in_build() { return 1; }

// Makes a side stream of `device` (waiting for the current one) current; `*out` is its handle
// for tchx_side_stream_leave.
int tchx_side_stream_enter(int device, void** out) {
  return guarded([&] { *out = new SideStream(static_cast<c10::DeviceIndex>(device)); });
}

// The caller's stream back, waiting for the side stream's work; frees the handle.
int tchx_side_stream_leave(void* handle) {
  auto* s = static_cast<SideStream*>(handle);
  int rc = guarded([&] { s->leave(); });
  delete s;
  return rc;
}

// Synchronizes `device`, then begins capturing on a new side stream; `*out` is the graph.
int tchx_graph_capture_begin(int device, void** out) {
  return guarded([&] {
    c10::cuda::device_synchronize();
    auto* g = new Graph(static_cast<c10::DeviceIndex>(device));
    try {
      g->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    } catch (...) {
      g->stream.leave();
      delete g;
      throw;
    }
    g->capturing = true;
    *out = g;
  });
}

// Ends the capture (instantiating the graph) and returns to the caller's stream.
int tchx_graph_capture_end(void* handle) {
  auto* g = static_cast<Graph*>(handle);
  int rc = guarded([&] {
    g->capturing = false;
    g->graph.capture_end();
  });
  int back = guarded([&] { g->stream.leave(); });
  return rc != 0 ? rc : back;
}

// Launches the captured work on the current stream.
int tchx_graph_replay(void* handle) {
  return guarded([&] { static_cast<Graph*>(handle)->graph.replay(); });
}

// Frees the graph and its memory pool (ending a capture a failure left open).
void tchx_graph_free(void* handle) {
  auto* g = static_cast<Graph*>(handle);
  if (g->capturing) {
    guarded([&] { g->graph.capture_end(); });
    guarded([&] { g->stream.leave(); });
  }
  delete g;
}
}

#else

namespace {
int unsupported() {
  scdino_shim::set_last_error(
      "this trainer was built without CUDA (build with --features cuda or nccl)");
  return -1;
}
}  // namespace

extern "C" {
int tchx_cuda_available_in_build() { return 0; }
int tchx_side_stream_enter(int, void**) { return unsupported(); }
int tchx_side_stream_leave(void*) { return unsupported(); }
int tchx_graph_capture_begin(int, void**) { return unsupported(); }
int tchx_graph_capture_end(void*) { return unsupported(); }
int tchx_graph_replay(void*) { return unsupported(); }
void tchx_graph_free(void*) {}
}
#endif
