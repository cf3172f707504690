// Stub (see common/error.h): forward declarations only.
#pragma once
namespace gloo {
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo
