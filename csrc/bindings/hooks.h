// The Python objects the bindings call back into, handed over by fastload/__init__.py when the
// package is imported (_C._register_hooks), so no C++ file imports a fastload module by name and
// the import graph shows every arrow. Read with the GIL held.
#pragma once
#include <pybind11/pybind11.h>

namespace fastload::hooks {

// fastload.SampleError: what a failing sample of a Python dataset raises.
pybind11::handle sample_error();
// fastload._gpu_memory.release_cached(device): empties torch's CUDA cache for one GPU.
pybind11::handle release_cache();
// fastload._advice.stall_warning(**figures): logs the one-time stall hint from the runtime's
// figures (runtime/run_stats.h StallFigures); the advice text is Python's.
pybind11::handle stall_warning();

}  // namespace fastload::hooks
