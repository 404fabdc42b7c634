// What the loader's bindings need of fl.Pack's (pack.cpp): whether a source packs rows, and a
// packed batch finished as users take it (a 1-D cu_seqlens of the batch's own length, max_seqlen).
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "core/batch_source.h"

namespace fastload {

bool is_packed_source(const BatchSource& source);
// batch["cu_seqlens"] cut to the batch's entries (a view, no copy) and batch["max_seqlen"] an int,
// from the batch's extras (a PackedBatchInfo).
void finish_packed_batch(pybind11::dict& batch, const std::shared_ptr<void>& extras);

}  // namespace fastload
