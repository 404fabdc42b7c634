// The pieces of fastload._C, one file each; module.cpp calls every register_* once.
#pragma once
#include <pybind11/pybind11.h>

namespace fastload {
void register_sampler(pybind11::module_& m);  // sampler.cpp: Sampler, plans, the enum spellings
void register_stream(pybind11::module_& m);   // stream.cpp: MixSchedule, StreamSampler
void register_sources(pybind11::module_& m);  // source.cpp: BatchSource, ArraySource, BatchLayout
void register_python_source(pybind11::module_& m);  // py_source.cpp: PythonSource, sample context
void register_loader(pybind11::module_& m);   // loader.cpp: Engine, Epoch, Iterator, exit parking
void register_arrow(pybind11::module_& m);    // arrow.cpp: ArrowTable, ArrowSource
void register_checksum(pybind11::module_& m); // checksum.cpp: Checksum64
void register_testing(pybind11::module_& m);  // testing.cpp: test instruments (private names)
void register_hooks(pybind11::module_& m);    // hooks.cpp: the Python objects the bindings call
void register_image(pybind11::module_& m);    // image.cpp: ImageFileSource, image decoders, fl.ImageError
void register_pack(pybind11::module_& m);     // pack.cpp: PackSource, PackSampler, PackEpochs (fl.Pack)
void register_tar(pybind11::module_& m);      // tar.cpp: tar_index, TarSource (fl.Tar)
}  // namespace fastload
