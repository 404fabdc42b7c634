// A column whose values are decoded into batch rows, one value at a time, on the collation thread:
// an image column's encoded bytes into pixels (fl.Arrow / fl.Parquet with decode=). The core
// hands each row's bytes (or, when they are null, the path of the file that holds them) to a
// ValueDecoder implemented above it (csrc/image), so the core knows nothing of what is decoded.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/batch_source.h"

namespace fastload {

// Where a value came from, for the decoder's messages (formatted only when a value fails).
struct ValueOrigin {
  const std::string* column = nullptr;  // the part's name
  int64_t row = 0;                      // the row in the data (through any indices mapping)
  int64_t sample = 0;                   // the sample id (keys the row's randomness)
};

class ValueDecoder {
 public:
  virtual ~ValueDecoder() = default;
  // The batch part the decoded rows fill, named `name` (fixed bytes per row).
  virtual PartSchema part(const std::string& name) const = 0;
  // One row into `out` (part(...).row_bytes bytes): `data`/`size` are the value's bytes, or, when
  // `data` is null, `path` names the file to read them from. Randomness is keyed by
  // (seed, epoch, origin.sample), so it does not depend on the thread. Throws with a message that
  // names `origin`.
  virtual void decode(const char* data, int64_t size, const std::string* path, uint64_t seed, int64_t epoch,
                      const ValueOrigin& origin, std::byte* out) const = 0;
};

}  // namespace fastload
