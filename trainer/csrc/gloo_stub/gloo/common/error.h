// Stub: ProcessGroupGloo.hpp includes gloo headers that the torch wheel does not ship. Its
// members hold gloo types only through shared_ptr, and the code we compile references only
// c10d symbols (libtorch_cpu carries the real gloo), so declarations suffice.
#pragma once
