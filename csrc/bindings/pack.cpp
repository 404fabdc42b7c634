// fastload._C.PackSource, PackSampler and PackEpochs: fl.Pack's packed rows (core/pack_source.h)
// and their plans (core/pack_plan.h) as Python holds them. Planning an epoch reads every
// document's length: it runs with the GIL released.
#include "bindings/pack.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bindings/python_ref.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "bindings/without_gil.h"
#include "core/array_source.h"
#include "core/arrow_source.h"
#include "core/pack_plan.h"
#include "core/pack_source.h"
#include "core/row_group_source.h"

namespace py = pybind11;

namespace fastload {

void finish_packed_batch(py::dict& batch, const std::shared_ptr<void>& extras) {
  const auto& info = *static_cast<const PackedBatchInfo*>(extras.get());
  const py::str key(kCuSeqlensName);
  batch[key] = batch[key].attr("view")(-1).attr("narrow")(0, 0, info.cu_entries);
  batch[py::str("max_seqlen")] = py::int_(info.max_seqlen);
}

bool is_packed_source(const BatchSource& source) { return dynamic_cast<const PackSource*>(&source) != nullptr; }

namespace {

// The reader of the inner source's list columns `names`.
std::shared_ptr<DocumentReader> reader_of(const std::shared_ptr<BatchSource>& inner,
                                                const std::vector<std::string>& names, int threads) {
  if (auto arrays = std::dynamic_pointer_cast<ArraySource>(inner)) {
    std::vector<ArrayColumn> picked;
    for (const std::string& name : names) {
      const ArrayColumn* found = nullptr;
      for (const ArrayColumn& c : arrays->columns())
        if (c.name == name) found = &c;
      if (!found) throw std::invalid_argument("the source has no column '" + name + "'");
      if (!found->ragged)
        throw std::invalid_argument("column '" + name + "' has rows of one size, not a ragged column: fl.Pack packs "
                                    "ragged columns (fl.Ragged); drop it with columns=[...]");
      picked.push_back(*found);
    }
    return std::make_shared<RaggedDocuments>(std::move(picked));
  }
  if (auto arrow = std::dynamic_pointer_cast<ArrowSource>(inner))
    return std::make_shared<ArrowDocuments>(arrow->table(), arrow->indices(), arrow_list_plans(*arrow->table(), names));
  if (auto groups = std::dynamic_pointer_cast<RowGroupSource>(inner))
    return std::make_shared<RowGroupDocuments>(groups, names, threads);
  throw std::invalid_argument("fl.Pack reads fl.Arrow, fl.Parquet, fl.Dataset with fl.Ragged columns and dataset "
                              "directories with ragged columns; this source is none of them");
}

std::shared_ptr<PackSource> pack_of(const SourceHandle& h) {
  auto p = std::dynamic_pointer_cast<PackSource>(h.source);
  if (!p) throw py::type_error("not a packed source (fl.Pack)");
  return p;
}

py::dict totals_dict(const PackTotals& t, int64_t length) {
  py::dict d;
  d["documents"] = t.documents;
  d["empty_documents"] = t.empty;
  d["rows"] = t.rows;
  d["tokens"] = t.tokens;
  d["truncated_tokens"] = t.truncated;
  d["longest_segment"] = t.longest;
  d["efficiency"] = t.rows ? static_cast<double>(t.tokens) / (static_cast<double>(t.rows) * static_cast<double>(length))
                           : 0.0;
  d["planning_s"] = t.seconds;
  return d;
}

// A loader's packed sampler: the batch geometry, the documents' order settings and the source.
struct PackSampler {
  std::shared_ptr<PackSource> source;
  SamplerConfig geometry;  // batch_size, world_size, rank, even, drop_last, seed
  SamplerConfig order;     // the documents' order: num_samples = documents, one replica
  int threads = 1;

  std::shared_ptr<const EpochPacking> packing(int64_t epoch) const {
    if (epoch < 0) throw std::invalid_argument("epoch must be non-negative, got " + std::to_string(epoch));
    return without_gil([&] { return source->epoch(order, epoch, threads); });
  }
  std::shared_ptr<PackEpochPlan> plan(int64_t epoch, int64_t start) const {
    auto p = packing(epoch);
    source->plan_ahead(order, epoch + 1, 1);  // the next epoch's plan while this one runs, on one thread
    return std::make_shared<PackEpochPlan>(std::move(p), geometry, start);
  }
};

PackSampler make_sampler(const SourceHandle& pack, int64_t batch_size, int64_t world_size, int64_t rank, uint64_t seed,
                         bool shuffle, const std::string& order, const std::string& even, bool drop_last,
                         int64_t block_size, std::vector<int64_t> shard_rows, int64_t window_shards, int threads) {
  PackSampler s;
  s.source = pack_of(pack);
  const int64_t docs = s.source->size();
  s.geometry = SamplerConfig(1, batch_size, world_size, rank, seed, false, Order::Random, parse_even(even), drop_last,
                             block_size);
  s.geometry.validate();
  if (batch_size > ((int64_t{1} << 31) - 1) / s.source->options().length)
    throw std::invalid_argument("batch_size x length must be below 2**31 (cu_seqlens is int32, FlashAttention's "
                                "type), got " + std::to_string(batch_size) + " x " +
                                std::to_string(s.source->options().length));
  s.order = SamplerConfig(docs, 1, 1, 0, seed, shuffle, parse_order(order), Even::Pad, false, block_size);
  s.order.shard_rows = std::move(shard_rows);
  s.order.window_shards = window_shards;
  s.order.validate();
  s.threads = std::max(1, threads);
  return s;
}

py::array_t<int64_t> plan_ids(const PackSampler& s, int64_t epoch, int64_t start, int64_t limit) {
  auto plan = s.plan(epoch, start);
  const int64_t batches = plan->num_batches();
  int64_t total = 0;
  for (int64_t b = 0; b < batches; ++b) total += plan->rows(b);
  if (total > limit / static_cast<int64_t>(sizeof(int64_t))) {
    PyErr_SetString(PyExc_MemoryError, ("plan of epoch " + std::to_string(epoch) + " holds " + std::to_string(total) +
                                        " packed rows, more than this machine's memory").c_str());
    throw py::error_already_set();
  }
  py::array_t<int64_t> out(total);
  int64_t* dst = out.mutable_data();
  without_gil([&] {
    int64_t at = 0;
    for (int64_t b = 0; b < batches; ++b) {
      BatchRows rows;
      rows.ids = dst + at;
      at += plan->fill(b, rows);
    }
  });
  return out;
}

}  // namespace

void register_pack(py::module_& m) {
  m.attr("PACK_SPLITS") = py::make_tuple(kPackSplitNames[0], kPackSplitNames[1], kPackSplitNames[2]);
  m.attr("PACK_PARTS") = py::make_tuple(kSegmentIdsName, kPositionIdsName, kCuSeqlensName, kDocumentsName);

  // inner: the source whose list columns are packed; columns: their names; pads: one element's
  // bytes per column. Reads every document's length (GIL released; a Parquet source's row groups
  // are decoded, on `threads` threads).
  m.def("PackSource", [](const SourceHandle& inner, const std::vector<std::string>& columns, int64_t length,
                         std::vector<py::bytes> pads, int64_t window, const std::string& split, int64_t max_segments,
                         bool with_documents, int threads, py::object owners) {
    PackOptions options;
    options.length = length;
    options.split = parse_pack_split(split);
    options.max_segments = max_segments;
    options.validate();
    std::vector<std::vector<std::byte>> pad_bytes;
    for (const py::bytes& b : pads) {
      const std::string s = b;
      pad_bytes.emplace_back(reinterpret_cast<const std::byte*>(s.data()),
                             reinterpret_cast<const std::byte*>(s.data()) + s.size());
    }
    std::shared_ptr<BatchSource> inner_source = inner.source;
    py::tuple keep = py::make_tuple(inner.keepalive, std::move(owners));
    // The reader holds what its memory belongs to (released with the GIL taken): plans and a
    // thread planning ahead may hold the reader after the Python handle is gone.
    std::shared_ptr<const void> owner = std::make_shared<PyRef>(PyRef::borrow(keep.ptr()));
    auto source = without_gil([&] {
      std::shared_ptr<DocumentReader> reader = reader_of(inner_source, columns, threads);
      reader->keep_alive(std::move(owner));
      return std::make_shared<PackSource>(std::move(reader), options, window, std::move(pad_bytes), with_documents,
                                          threads);
    });
    return SourceHandle{std::move(source), std::move(keep)};
  }, py::arg("inner"), py::arg("columns"), py::arg("length"), py::arg("pads"), py::arg("window"), py::arg("split"),
     py::arg("max_segments"), py::arg("with_documents"), py::arg("threads"), py::arg("owners"));

  m.def("pack_array_columns", [](const SourceHandle& h) {
    // (name, ragged) of an array source's columns: which ones fl.Pack can pack.
    auto arrays = std::dynamic_pointer_cast<ArraySource>(h.source);
    if (!arrays) throw py::type_error("not an array source");
    std::vector<std::pair<std::string, bool>> out;
    for (const ArrayColumn& c : arrays->columns()) out.emplace_back(c.name, c.ragged);
    return out;
  }, py::arg("source"));

  m.def("pack_with_documents", [](const SourceHandle& h) {
    // The same packer with the "documents" part (a loader's with_index=True), sharing its reader.
    auto p = pack_of(h);
    return SourceHandle{std::make_shared<PackSource>(*p, true), h.keepalive};
  }, py::arg("source"));

  m.def("pack_scan", [](const SourceHandle& h) {
    auto p = pack_of(h);
    const PackScan& s = p->scan();
    py::dict d;
    d["documents"] = s.documents;
    d["empty_documents"] = s.empty;
    d["tokens"] = s.tokens;
    d["longest_document"] = s.longest;
    d["window"] = s.window;
    d["cu_seqlens_per_row"] = p->cu_seqlens_per_row();
    return d;
  }, py::arg("source"), "what a packed source found in its documents when it was made");

  m.def("pack_default_window", &PackSource::default_window, py::arg("documents"), py::arg("nonempty"), py::arg("tokens"),
        py::arg("length"));

  py::class_<BatchPlan, std::shared_ptr<BatchPlan>>(m, "BatchPlan", "One output's batches (a plan the engine runs).")
      .def("num_batches", &BatchPlan::num_batches)
      .def("position_after", &BatchPlan::position_after, py::arg("batches_done"));

  py::class_<PackSampler>(m, "PackSampler", "The sampling contract over an epoch's packed rows (fl.Pack).")
      .def(py::init(&make_sampler), py::arg("pack"), py::arg("batch_size"), py::arg("world_size"), py::arg("rank"),
           py::arg("seed"), py::arg("shuffle"), py::arg("order"), py::arg("even"), py::arg("drop_last"),
           py::arg("block_size"), py::arg("shard_rows"), py::arg("window_shards"), py::arg("threads"))
      .def_property_readonly("batch_size", [](const PackSampler& s) { return s.geometry.batch_size; })
      .def("rows", [](const PackSampler& s, int64_t epoch) { return s.packing(epoch)->rows(); }, py::arg("epoch"),
           "packed rows of the epoch (all ranks, before even=)")
      .def("totals", [](const PackSampler& s, int64_t epoch) {
             return totals_dict(s.packing(epoch)->totals(), s.source->options().length);
           }, py::arg("epoch"))
      .def("num_batches", [](const PackSampler& s, int64_t epoch, int64_t start) {
             return s.plan(epoch, start)->num_batches();
           }, py::arg("epoch"), py::arg("start") = 0)
      .def("end_position", [](const PackSampler& s, int64_t epoch, int64_t start) {
             return s.plan(epoch, start)->rows_plan().end_position();
           }, py::arg("epoch"), py::arg("start") = 0)
      .def("position_after", [](const PackSampler& s, int64_t epoch, int64_t start, int64_t k) {
             return s.plan(epoch, start)->position_after(k);
           }, py::arg("epoch"), py::arg("start"), py::arg("batches_done"))
      .def("batch_ids", [](const PackSampler& s, int64_t epoch, int64_t start, int64_t step) {
             auto plan = s.plan(epoch, start);
             if (step < 0 || step >= plan->num_batches())
               throw py::index_error("batch " + std::to_string(step) + " out of range");
             const int64_t n = plan->rows(step);
             py::array_t<int64_t> ids(n);
             py::array_t<bool> valid(n);
             BatchRows rows;
             rows.ids = ids.mutable_data();
             rows.valid = valid.mutable_data();
             plan->fill(step, rows);
             return py::make_tuple(ids, valid);
           }, py::arg("epoch"), py::arg("start"), py::arg("step"))
      .def("plan", &plan_ids, py::arg("epoch"), py::arg("start") = 0,
           py::arg("memory_limit") = std::numeric_limits<int64_t>::max(),
           "this rank's packed-row ids of an epoch (positions in the epoch's rows; >= rows: empty rows)")
      .def("make_plan", [](const PackSampler& s, int64_t epoch, int64_t start) -> std::shared_ptr<BatchPlan> {
             return s.plan(epoch, start);
           }, py::arg("epoch"), py::arg("start"))
      .def("row_segments", [](const PackSampler& s, int64_t epoch, int64_t row) {
             // Row `row` of the epoch as (document, start, count) triples (tests, debugging).
             auto packing = s.packing(epoch);
             const auto [w, k] = packing->locate(row);
             PackScratch scratch;
             PackedWindow out;
             packing->pack(w, scratch, out);
             py::list segs;
             for (int64_t j = out.row_start[static_cast<size_t>(k)]; j < out.row_start[static_cast<size_t>(k) + 1]; ++j) {
               const PackSegment& seg = out.segments[static_cast<size_t>(j)];
               segs.append(py::make_tuple(seg.doc, seg.start, seg.count));
             }
             return segs;
           }, py::arg("epoch"), py::arg("row"))
      .def("stream", [](const PackSampler& s, int64_t first_epoch, int64_t first_start) {
             // The epochs of a stream of packed rows (steps=) from epoch first_epoch at position first_start.
             PackSampler copy = s;
             return without_gil([&] {
               return std::make_shared<PackEpochs>(
                   [copy](int64_t e) { return copy.source->epoch(copy.order, e, copy.threads); }, first_epoch,
                   first_start);
             });
           }, py::arg("first_epoch"), py::arg("first_start"));

  py::class_<PackEpochs, std::shared_ptr<PackEpochs>>(m, "PackEpochs", "The epochs of a stream of packed rows.")
      .def("epoch_at", [](const PackEpochs& e, int64_t position) {
             return without_gil([&] { return e.epoch_at(position); });
           }, py::arg("position"), "(epoch, its first stream position) holding a stream position")
      .def("make_plan", [](std::shared_ptr<PackEpochs> e, int64_t origin, int64_t position, int64_t batch_size,
                           int64_t replicas, int64_t rank, int64_t first_step, int64_t end_step, int64_t epoch,
                           uint64_t seed) -> std::shared_ptr<BatchPlan> {
             PackAnchor anchor;
             anchor.origin = origin;
             anchor.position = position;
             return std::make_shared<PackStreamPlan>(std::move(e), anchor, batch_size, replicas, rank, first_step,
                                                     end_step, epoch, seed);
           }, py::arg("origin"), py::arg("position"), py::arg("batch_size"), py::arg("replicas"), py::arg("rank"),
           py::arg("first_step"), py::arg("end_step"), py::arg("epoch"), py::arg("seed"))
      .def("ids", [](std::shared_ptr<PackEpochs> e, int64_t origin, int64_t position, int64_t batch_size,
                     int64_t replicas, int64_t rank, int64_t first_step, int64_t end_step) {
             // This replica's row ids (stream positions) of global steps [first_step, end_step).
             PackAnchor anchor;
             anchor.origin = origin;
             anchor.position = position;
             PackStreamPlan plan(std::move(e), anchor, batch_size, replicas, rank, first_step, end_step, 0, 0);
             py::array_t<int64_t> out((end_step - first_step) * batch_size);
             int64_t* dst = out.mutable_data();
             for (int64_t b = 0; b < plan.num_batches(); ++b) {
               BatchRows rows;
               rows.ids = dst + b * batch_size;
               plan.fill(b, rows);
             }
             return out;
           }, py::arg("origin"), py::arg("position"), py::arg("batch_size"), py::arg("replicas"), py::arg("rank"),
           py::arg("first_step"), py::arg("end_step"));
}

}  // namespace fastload
