// Tar shards located once: the members of a tar (ustar, PAX extended headers, GNU long names)
// found by walking its 512-byte headers, and grouped into samples as WebDataset groups them.
// The result is plain offsets into the file; reading a member is then a range of the mapped file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

// One regular file of a tar: its path and where its bytes are in the tar.
struct TarMember {
  std::string name;
  int64_t offset = 0;  // of the data, from the start of the tar
  int64_t size = 0;
};

// The regular-file members of the tar `data` (of `size` bytes), in tar order. Directories, links
// and other entries are skipped. `shard` names the tar in errors. Throws std::invalid_argument
// naming the shard and the offset for a header whose checksum does not match, a header or member
// that runs past the end (a truncated tar), a bad number field, or a compressed file (gzip, bzip2,
// xz, zstd: a compressed tar has no random access).
std::vector<TarMember> list_tar_members(const uint8_t* data, size_t size, const std::string& shard);

// WebDataset's rule for one member path: the key is the path up to the first dot of its file
// name (the folder part kept, so dots in folder names do not split), the field the rest after
// that dot, lower-cased. False for a member that belongs to no sample: no dot in the file name,
// a file name starting with a dot, an empty suffix, or a top-level "__name__" metadata file.
bool split_tar_member(const std::string& path, std::string* key, std::string* field);

// The samples of one shard: consecutive members with the same key form a sample (tar order).
struct TarSamples {
  std::vector<std::string> fields;   // every field that occurs, in order of first occurrence
  std::string keys;                  // sample keys back to back
  std::vector<int64_t> key_offsets;  // samples + 1 entries: key i is keys[key_offsets[i], key_offsets[i + 1])
  // samples x fields, row-major: the member's data offset and size, -1 where the sample lacks the field
  std::vector<int64_t> offsets, sizes;
  int64_t skipped_members = 0;       // members that belong to no sample (split_tar_member)
  int64_t samples() const { return key_offsets.empty() ? 0 : static_cast<int64_t>(key_offsets.size()) - 1; }
};

// Groups `members` into samples. Throws std::invalid_argument naming the shard and the key for a
// key whose members are not consecutive (a duplicate sample) or a field twice in one sample.
TarSamples group_tar_samples(const std::vector<TarMember>& members, const std::string& shard);

// Maps the file at `path` read-only, lists its members and groups them. Throws
// std::invalid_argument naming the path when it cannot be opened or is not a valid tar.
TarSamples index_tar_file(const std::string& path, int64_t* file_size = nullptr);

}  // namespace fastload
