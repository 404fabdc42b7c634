// The loader's native side as Python sees it: fastload._C.Engine (threads, buffers, transfer
// engines), Epoch (one started epoch) and Iterator (one output's batches, next() in C++ so a
// Ctrl-C can never fall between taking a batch and handing it over).
#pragma once
#include <pybind11/pybind11.h>

namespace fastload {
void bind_loader(pybind11::module_& m);
}  // namespace fastload
