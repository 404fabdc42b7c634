// A fast streaming 64-bit checksum for dataset shard files: catches corrupt or truncated data,
// not an adversary. Four independent multiply-rotate lanes over 32-byte stripes (a core runs them
// in parallel, several GB/s), fed in any chunking: the digest depends only on the bytes.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastload {

class Checksum64 {
 public:
  Checksum64();
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  void stripe(const unsigned char* p);
  uint64_t lanes_[4];
  uint64_t length_ = 0;
  unsigned char tail_[32];
  size_t tail_bytes_ = 0;
};

}  // namespace fastload
