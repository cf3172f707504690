// Stub (see common/error.h): an opaque context; setTimeout is named by an inline method of
// ProcessGroupGloo that this project never calls.
#pragma once
#include <chrono>
namespace gloo {
class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};
}  // namespace gloo
