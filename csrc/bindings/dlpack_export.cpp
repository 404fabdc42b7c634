// DLPack capsules over batch buffers; see dlpack_export.h.
#include "bindings/dlpack_export.h"

#include "bindings/dlpack.h"

namespace fastload {

namespace {
constexpr const char* kCapsuleName = "dltensor";
constexpr const char* kUsedCapsuleName = "used_dltensor";  // renamed by the consumer

struct ManagedPart {
  DLManagedTensor tensor;
  std::shared_ptr<void> owner;
  std::vector<int64_t> shape, strides;
};

void delete_part(DLManagedTensor* self) {
  delete static_cast<ManagedPart*>(self->manager_ctx);
}

// A capsule never consumed (e.g. dropped on an exception) still owns its tensor.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (t && t->deleter) t->deleter(t);
  PyErr_Clear();
  PyErr_Restore(type, value, traceback);
}
}  // namespace

pybind11::capsule export_tensor(std::shared_ptr<void> owner, void* data, int device_type, int device_id,
                                DType dtype, int64_t rows, const std::vector<int64_t>& row_shape) {
  auto* part = new ManagedPart();
  part->owner = std::move(owner);
  part->shape.reserve(row_shape.size() + 1);
  part->shape.push_back(rows);
  part->shape.insert(part->shape.end(), row_shape.begin(), row_shape.end());
  part->strides.assign(part->shape.size(), 1);
  for (int i = static_cast<int>(part->shape.size()) - 2; i >= 0; --i)
    part->strides[i] = part->strides[i + 1] * part->shape[i + 1];
  DLTensor& t = part->tensor.dl_tensor;
  t.data = data;
  t.device = {static_cast<DLDeviceType>(device_type), device_id};
  t.ndim = static_cast<int32_t>(part->shape.size());
  t.dtype = {dtype.code, dtype.bits, 1};
  t.shape = part->shape.data();
  t.strides = part->strides.data();
  t.byte_offset = 0;
  part->tensor.manager_ctx = part;
  part->tensor.deleter = delete_part;
  PyObject* cap = PyCapsule_New(&part->tensor, kCapsuleName, capsule_destructor);
  if (!cap) {
    delete part;
    throw pybind11::error_already_set();
  }
  return pybind11::reinterpret_steal<pybind11::capsule>(cap);
}

}  // namespace fastload
