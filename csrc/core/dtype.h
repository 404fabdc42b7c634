// An element type as DLPack names it (code and bits): what the core tells the bindings about
// each part of a batch, so that they can hand it out as a typed tensor.
#pragma once
#include <cstdint>

namespace fastload {

// DLPack's DLDataTypeCode values.
enum DTypeKind : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBFloat = 4, kComplex = 5, kBool = 6 };

struct DType {
  uint8_t code = kUInt;  // DLDataTypeCode
  uint8_t bits = 8;
  friend bool operator==(DType a, DType b) { return a.code == b.code && a.bits == b.bits; }
  friend bool operator!=(DType a, DType b) { return !(a == b); }
};

inline constexpr DType kInt64{kInt, 64};
inline constexpr DType kBoolType{kBool, 8};

}  // namespace fastload
