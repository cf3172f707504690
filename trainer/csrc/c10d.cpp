// libtorch's own process groups (c10d) behind a C ABI: TCPStore rendezvous, ProcessGroupGloo
// (CPU) and, with SCDINO_NCCL, ProcessGroupNCCL (CUDA). Collectives return work handles that
// Rust waits on with a timeout. Kept minimal; the logic is in trainer/src/distributed/.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef SCDINO_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "guarded.h"

namespace {
using scdino_shim::guarded;

struct Group {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
};

struct Work {
  c10::intrusive_ptr<c10d::Work> work;
};

c10d::ReduceOp reduce_op(int op) {
  switch (op) {
    case 0: return c10d::ReduceOp::SUM;
    case 1: return c10d::ReduceOp::AVG;
    case 2: return c10d::ReduceOp::MAX;
    case 3: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::PRODUCT;
  }
}
// Whether something at host:port accepts a TCP connection within `timeout` (closed again at
// once).
bool accepts_connections(const char* host, int port, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host, std::to_string(port).c_str(), &hints, &found) != 0) return false;
  bool open = false;
  for (addrinfo* a = found; a != nullptr && !open; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      open = poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
             getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
  }
  freeaddrinfo(found);
  return open;
}
}  // namespace

extern "C" {

// Rendezvous through a TCPStore at host:port (rank 0 serves it), then a Gloo (cuda=0) or
// NCCL (cuda=1) process group. Returns NULL on error.
//
// `generation` numbers the groups a process creates one after another on the same port (the
// pipeline: training, then features per checkpoint). A rank that finishes a stage before
// rank 0 has closed that stage's store can connect to it instead of the next one; it then
// waits for this generation's key, which only the new store gets, until the old store closes
// under it, and reconnects. The old store may also close while this rank is still talking to
// it (the client's handshake, or a check for the key): that is retried the same way, within
// the one timeout.
//
// `stop` (NULL for none) is a flag a signal handler sets (Rust's AtomicBool, one byte): while
// this rank waits for the others it looks at the flag every 0.1 s (after at most one 0.5 s
// connection try) and, once set, gives up with `*stopped` = 1, so a stop signal ends the wait
// rather than the timeout.
void* c10d_group_new(const char* host, int port, int rank, int world, int timeout_ms, int cuda, int gloo_threads,
                     int generation, const unsigned char* stop, int* stopped) {
  Group* g = nullptr;
  *stopped = 0;
  int rc = guarded([&] {
    using std::chrono::milliseconds;
    auto timeout = milliseconds(timeout_ms);
    auto deadline = std::chrono::steady_clock::now() + timeout;
    auto left = [&] {
      return std::max(std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now()),
                      milliseconds(1));
    };
    auto past_deadline = [&] { return std::chrono::steady_clock::now() >= deadline; };
    // Every wait below is cut into short slices with a look at the stop flag in between.
    auto give_up_if_stopped = [&] {
      if (stop != nullptr && __atomic_load_n(stop, __ATOMIC_RELAXED) != 0) {
        *stopped = 1;
        throw std::runtime_error("stopped by a signal while waiting for the other ranks");
      }
    };
    const auto slice = milliseconds(500);
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<std::uint16_t>(port);
    opts.isServer = rank == 0;
    opts.numWorkers = world;
    // The ranks count themselves in below, where a stop can interrupt the wait.
    opts.waitWorkers = false;
    opts.timeout = timeout;
    const std::string ready = "scdino/generation/" + std::to_string(generation);
    c10::intrusive_ptr<c10d::TCPStore> tcp;
    for (;;) {
      give_up_if_stopped();
      if (rank == 0) {
        tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
        tcp->set(ready, std::vector<uint8_t>{1});
        break;
      }
      // Nobody listens yet (rank 0 is busy elsewhere): probe quietly rather than let the
      // store's client try, which logs every failed try with a backtrace.
      if (!accepts_connections(host, port, std::min(left(), slice))) {
        if (past_deadline()) {
          throw std::runtime_error("timed out: nobody opened the store at " + std::string(host) + ":" +
                                   std::to_string(port));
        }
        std::this_thread::sleep_for(milliseconds(50));
        continue;
      }
      try {
        // The old store can close while the client's handshake still talks to it, so
        // connecting is retried like waiting.
        opts.timeout = std::min(left(), slice);
        tcp = c10::make_intrusive<c10d::TCPStore>(std::string(host), opts);
        while (!tcp->check({ready})) {
          give_up_if_stopped();
          if (past_deadline()) {
            throw std::runtime_error("timed out waiting for rank 0 to open this stage's store (generation " +
                                     std::to_string(generation) + ")");
          }
          // Every waiting worker asks rank 0's store: 512 ranks at one look per 100 ms are
          // 5,000 small requests a second, and a stop is seen within 0.1 s.
          std::this_thread::sleep_for(milliseconds(100));
        }
        break;
      } catch (const c10::DistNetworkError&) {
        if (past_deadline()) throw;
        std::this_thread::sleep_for(milliseconds(50));
      }
    }
    // Every rank waits until all have joined, so the backend's own rendezvous below (not
    // interruptible) starts only once nobody is missing.
    const std::string joined = "scdino/joined";
    tcp->setTimeout(timeout);
    try {
      tcp->add(joined, 1);
      for (;;) {
        auto n = tcp->add(joined, 0);
        if (n >= world) break;
        give_up_if_stopped();
        if (past_deadline()) {
          throw std::runtime_error("timed out with " + std::to_string(n) + " of " + std::to_string(world) +
                                   " ranks at the rendezvous");
        }
        std::this_thread::sleep_for(milliseconds(50));
      }
    } catch (const c10::DistNetworkError&) {
      // Rank 0 stopped on the same signal and took its store with it: a stop, not a failure.
      give_up_if_stopped();
      throw;
    }
    auto group = std::make_unique<Group>();
    group->store = tcp;
    if (cuda) {
#ifdef SCDINO_NCCL
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("nccl/", tcp);
      auto nopts = c10d::ProcessGroupNCCL::Options::create();
      nopts->timeout = timeout;
      group->backend = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, rank, world, nopts);
#else
      throw std::runtime_error("this trainer was built without NCCL support (cargo feature `nccl`)");
#endif
    } else {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>("gloo/", tcp);
      auto gopts = c10d::ProcessGroupGloo::Options::create(timeout);
      // Each rank binds an interface of its own host, as PyTorch does: GLOO_SOCKET_IFNAME if
      // set, else the address this host's name resolves to (loopback as a fallback). Binding
      // the master's name would mean another machine's address on every other node.
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      gopts->devices.push_back(ifname && *ifname
                                   ? c10d::ProcessGroupGloo::createDeviceForInterface(std::string(ifname))
                                   : c10d::ProcessGroupGloo::createDefaultDevice());
      if (gloo_threads > 0) gopts->threads = gloo_threads;
      group->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, world, gopts);
    }
    g = group.release();
  });
  return rc == 0 ? g : nullptr;
}

void c10d_group_free(void* group) { delete static_cast<Group*>(group); }

static void* start(const std::function<c10::intrusive_ptr<c10d::Work>()>& f) {
  Work* w = nullptr;
  int rc = guarded([&] { w = new Work{f()}; });
  return rc == 0 ? w : nullptr;
}

void* c10d_all_reduce(void* group, at::Tensor** tensors, int n, int op) {
  auto* g = static_cast<Group*>(group);
  return start([&] {
    std::vector<at::Tensor> ts;
    for (int i = 0; i < n; ++i) ts.push_back(*tensors[i]);
    c10d::AllreduceOptions o;
    o.reduceOp = reduce_op(op);
    return n == 1 ? g->backend->allreduce(ts, o) : g->backend->allreduce_coalesced(ts, c10d::AllreduceCoalescedOptions{o});
  });
}

void* c10d_broadcast(void* group, at::Tensor* tensor, int root) {
  auto* g = static_cast<Group*>(group);
  return start([&] {
    std::vector<at::Tensor> ts{*tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return g->backend->broadcast(ts, o);
  });
}

void* c10d_all_gather(void* group, at::Tensor* output, at::Tensor* input) {
  auto* g = static_cast<Group*>(group);
  return start([&] { return g->backend->_allgather_base(*output, *input); });
}

void* c10d_reduce_scatter(void* group, at::Tensor* output, at::Tensor* input, int op) {
  auto* g = static_cast<Group*>(group);
  return start([&] {
    c10d::ReduceScatterOptions o;
    o.reduceOp = reduce_op(op);
    return g->backend->_reduce_scatter_base(*output, *input, o);
  });
}

void* c10d_barrier(void* group) {
  auto* g = static_cast<Group*>(group);
  return start([&] { return g->backend->barrier(); });
}

// 0: done; -1: error or timeout (message in c10d_last_error). Frees nothing.
int c10d_work_wait(void* work, int timeout_ms) {
  auto* w = static_cast<Work*>(work);
  return guarded([&] {
    bool ok = w->work->wait(std::chrono::milliseconds(timeout_ms));
    if (!ok) throw std::runtime_error("collective timed out");
  });
}

void c10d_work_free(void* work) { delete static_cast<Work*>(work); }
}
