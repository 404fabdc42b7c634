// fastload._C.ArrowTable and ArrowSource: Arrow data taken from any producer through the Arrow
// PyCapsule interface (__arrow_c_stream__ / __arrow_c_array__), moved out of the capsules into a
// core ArrowTable (the producer's release callbacks are called when the table goes).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/callback_error.h"
#include "bindings/image.h"
#include "bindings/python_ref.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "core/arrow_source.h"
#include "core/arrow_table.h"
#include "core/row_group_source.h"

namespace py = pybind11;

namespace fastload {

namespace {

template <typename T>
T* capsule_pointer(const py::object& capsule, const char* name) {
  if (!PyCapsule_CheckExact(capsule.ptr()) || !PyCapsule_IsValid(capsule.ptr(), name))
    throw py::type_error(std::string("expected a PyCapsule named '") + name + "', got " +
                         std::string(py::str(py::type::of(capsule).attr("__name__"))));
  auto* p = static_cast<T*>(PyCapsule_GetPointer(capsule.ptr(), name));
  if (!p || !p->release) throw py::value_error(std::string("the '") + name + "' capsule was already consumed");
  return p;
}

// What was read from a stream so far, released if the table is never built.
struct Pending {
  ArrowSchema schema{};
  std::vector<ArrowArray> arrays;
  ~Pending() {
    for (ArrowArray& a : arrays)
      if (a.release) a.release(&a);
    if (schema.release) schema.release(&schema);
  }
  std::shared_ptr<ArrowTable> table() {
    std::vector<ArrowArray*> ptrs;
    for (ArrowArray& a : arrays) ptrs.push_back(&a);
    return std::make_shared<ArrowTable>(&schema, std::move(ptrs));  // marks ours released
  }
};

std::shared_ptr<ArrowTable> from_stream(const py::object& capsule) {
  ArrowArrayStream* given = capsule_pointer<ArrowArrayStream>(capsule, "arrow_array_stream");
  ArrowArrayStream stream = *given;  // moved: the capsule's destructor now sees it released
  given->release = nullptr;
  struct Release {
    ArrowArrayStream* s;
    ~Release() { s->release(s); }
  } release{&stream};
  auto fail = [&](const char* what, int code) {
    const char* message = stream.get_last_error ? stream.get_last_error(&stream) : nullptr;
    throw py::value_error(std::string("the Arrow stream failed in ") + what + " (error " + std::to_string(code) +
                          (message ? std::string("): ") + message : std::string(")")));
  };
  Pending pending;
  if (int rc = stream.get_schema(&stream, &pending.schema)) fail("get_schema", rc);
  for (;;) {
    ArrowArray next{};
    if (int rc = stream.get_next(&stream, &next)) fail("get_next", rc);
    if (!next.release) break;
    pending.arrays.push_back(next);
  }
  return pending.table();
}

std::shared_ptr<ArrowTable> from_array(const py::object& schema_capsule, const py::object& array_capsule) {
  ArrowSchema* schema = capsule_pointer<ArrowSchema>(schema_capsule, "arrow_schema");
  ArrowArray* array = capsule_pointer<ArrowArray>(array_capsule, "arrow_array");
  Pending pending;
  pending.schema = *schema;
  schema->release = nullptr;
  pending.arrays.push_back(*array);
  array->release = nullptr;
  return pending.table();
}

const char* kind_name(ArrowKind k) {
  switch (k) {
    case ArrowKind::kFixed: return "fixed";
    case ArrowKind::kBool: return "bool";
    case ArrowKind::kList: return "list";
    case ArrowKind::kBytes: return "bytes";
  }
  return "?";
}

std::vector<std::byte> bytes_of(const py::bytes& b) {
  const std::string s = b;
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

std::vector<ArrowColumnRequest> requests_of(const py::list& requests) {
  std::vector<ArrowColumnRequest> cols;
  for (const py::handle& h : requests) {
    const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
    ArrowColumnRequest r;
    r.name = t[0].cast<std::string>();
    r.max_items = t[1].cast<int64_t>();
    r.pad = bytes_of(t[2]);
    r.fill = t[3].cast<bool>();
    r.fill_value = bytes_of(t[4]);
    r.with_valid = t[5].cast<bool>();
    r.as_list = py::len(t) > 6 && t[6].cast<bool>();
    if (py::len(t) > 7) r.shape = t[7].cast<std::vector<int64_t>>();
    if (py::len(t) > 8) r.list_shape = t[8].cast<std::vector<int64_t>>();
    r.fill_none = py::len(t) > 9 && t[9].cast<bool>();
    if (py::len(t) > 10 && !t[10].is_none()) {  // (image spec, fallback, path column, part name): decode=
      r.decoder = image_column_decoder(t[10].cast<py::tuple>(), py::reinterpret_borrow<py::object>(t[11]));
      r.path_column = t[12].cast<std::string>();
      r.decoded_name = t[13].cast<std::string>();
    }
    cols.push_back(std::move(r));
  }
  return cols;
}

}  // namespace

void register_arrow(py::module_& m) {
  py::class_<ArrowTable, std::shared_ptr<ArrowTable>>(m, "ArrowTable",
                                                       "Arrow record batches moved out of their producer's capsules.")
      .def_static("from_stream", &from_stream, py::arg("capsule"), "from an 'arrow_array_stream' PyCapsule")
      .def_static("from_array", &from_array, py::arg("schema_capsule"), py::arg("array_capsule"),
                  "from 'arrow_schema' and 'arrow_array' PyCapsules (one record batch)")
      .def_property_readonly("rows", &ArrowTable::rows)
      .def_property_readonly("chunk_rows", [](const ArrowTable& t) {
        std::vector<int64_t> rows;
        for (size_t c = 0; c + 1 < t.starts().size(); ++c) rows.push_back(t.starts()[c + 1] - t.starts()[c]);
        return rows;
      })
      .def_property_readonly("columns", [](const ArrowTable& t) {
        py::list out;
        for (const ArrowColumnInfo& c : t.columns()) {
          py::dict d;
          d["name"] = c.name;
          d["type"] = c.type;
          d["unsupported"] = c.unsupported;
          d["kind"] = kind_name(c.kind);
          d["dtype"] = py::make_tuple(c.dtype.code, c.dtype.bits);
          d["item_shape"] = c.item_shape;
          d["first_null"] = c.first_null;
          d["dictionary"] = c.dictionary;
          d["field_path"] = c.field_path;
          d["inner_lists"] = c.inner_lists;
          d["extension"] = c.extension;
          d["extension_metadata"] = py::bytes(c.extension_metadata);
          out.append(d);
        }
        return out;
      }, "[{name, type, unsupported, kind, dtype (dlpack code, bits), item_shape, first_null, dictionary, field_path, "
         "inner_lists (list levels inside a list), extension (name), extension_metadata (bytes)}]")
      .def_property_readonly("metadata", [](const ArrowTable& t) {
        py::dict out;
        for (const auto& [key, value] : t.metadata()) out[py::bytes(key)] = py::bytes(value);
        return out;
      }, "the schema's key-value metadata {bytes: bytes}")
      .def("longest", [](const ArrowTable& t, const std::string& name) {
        const size_t i = t.column_index(name);
        py::gil_scoped_release nogil;
        return t.longest(i);
      }, py::arg("name"), "a list or string column's longest row (items or bytes): reads its offsets");

  // requests: [(name, max_items, pad bytes, fill, fill bytes, with_valid, as_list, shape, list_shape,
  // fill_none[, image spec, fallback, path column, part name])] (see ArrowColumnRequest; the last
  // four optional, then the four of a decoded column, or none); owners: kept alive.
  m.def("ArrowSource", [](std::shared_ptr<ArrowTable> table, const py::list& requests,
                          std::shared_ptr<ArrowTable> indices, py::object owners) {
    auto source = std::make_shared<ArrowSource>(std::move(table), requests_of(requests), std::move(indices));
    return SourceHandle{std::move(source), std::move(owners)};
  }, py::arg("table"), py::arg("requests"), py::arg("indices"), py::arg("owners"));

  // decode(group) -> (an 'arrow_array_stream' capsule, bytes): called on the collation threads
  // and the source's decode threads with the GIL taken (pyarrow releases it while it decodes).
  m.def("RowGroupSource", [](std::shared_ptr<ArrowTable> schema, const py::list& requests,
                             std::vector<int64_t> group_rows, std::vector<std::string> group_names,
                             const py::object& decode, int64_t budget_bytes, int min_groups, int decode_threads,
                             py::object owners) {
    auto fn = std::make_shared<PyRef>(PyRef::borrow(decode.ptr()));
    RowGroupSource::Decode call = [fn](int64_t group, int64_t* bytes) {
      GilScope gil;
      try {
        py::object out = py::reinterpret_borrow<py::object>(fn->get())(group);
        const py::tuple t = out.cast<py::tuple>();
        *bytes = t[1].cast<int64_t>();
        return from_stream(t[0]);
      } catch (py::error_already_set& e) {
        if (keeps_type(e)) throw callback_error(e);  // an object deleted from its bucket: FileNotFoundError
        const std::string what = e.what();  // the message, read while the GIL is held
        e.restore();
        PyErr_Clear();
        throw std::invalid_argument(what);
      }
    };
    auto source = std::make_shared<RowGroupSource>(std::move(schema), requests_of(requests), std::move(group_rows),
                                                   std::move(group_names), std::move(call), budget_bytes,
                                                   min_groups, decode_threads);
    return SourceHandle{std::move(source), std::move(owners)};
  }, py::arg("schema"), py::arg("requests"), py::arg("group_rows"), py::arg("group_names"), py::arg("decode"),
     py::arg("budget_bytes"), py::arg("min_groups"), py::arg("decode_threads"), py::arg("owners"));
  auto row_groups = [](const SourceHandle& h) {
    auto s = std::dynamic_pointer_cast<RowGroupSource>(h.source);
    if (!s) throw py::type_error("not a row-group source");
    return s;
  };
  m.def("row_group_decodes", [row_groups](const SourceHandle& h) {
    auto s = row_groups(h);
    return py::make_tuple(s->decodes(), s->cached_bytes(), s->decoded_ahead());
  }, py::arg("source"), "(row groups decoded so far, bytes of decoded row groups cached now, of the decodes "
                        "those by the decode threads)");
  m.def("row_group_stop", [row_groups](const SourceHandle& h) {
    auto s = row_groups(h);
    py::gil_scoped_release nogil;  // a decode thread finishing its group takes the GIL
    s->stop_decoding();
  }, py::arg("source"), "stops and joins the source's decode threads");
}

}  // namespace fastload
