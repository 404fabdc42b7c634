// Tar headers walked and members grouped into samples; see tar_index.h.
#include "core/tar_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace fastload {

namespace {

constexpr size_t kBlock = 512;

[[noreturn]] void bad_tar(const std::string& shard, int64_t offset, const std::string& what) {
  throw std::invalid_argument("tar shard '" + shard + "': " + what + " (header at offset " + std::to_string(offset) +
                              ")");
}

// What a compressed file starts with; empty if it is none we know.
std::string compression_of(const uint8_t* d, size_t n) {
  if (n >= 2 && d[0] == 0x1f && d[1] == 0x8b) return "gzip";
  if (n >= 3 && d[0] == 'B' && d[1] == 'Z' && d[2] == 'h') return "bzip2";
  if (n >= 6 && std::memcmp(d, "\xfd" "7zXZ\0", 6) == 0) return "xz";
  if (n >= 4 && d[0] == 0x28 && d[1] == 0xb5 && d[2] == 0x2f && d[3] == 0xfd) return "zstd";
  return "";
}

// A header's number field: octal digits (leading spaces and NULs allowed, ended by a space or
// NUL), or GNU's base-256 (the first byte's high bit set). -1 if malformed.
int64_t number_field(const uint8_t* f, size_t n) {
  if (f[0] & 0x80) {
    if (f[0] != 0x80) return -1;  // negative, or more than 63 bits
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 55) return -1;
      v = (v << 8) | f[i];
    }
    return static_cast<int64_t>(v);
  }
  size_t i = 0;
  while (i < n && (f[i] == ' ' || f[i] == 0)) ++i;
  uint64_t v = 0;
  bool digits = false;
  for (; i < n && f[i] >= '0' && f[i] <= '7'; ++i) {
    if (v >> 60) return -1;
    v = v * 8 + static_cast<uint64_t>(f[i] - '0');
    digits = true;
  }
  for (; i < n; ++i)
    if (f[i] != ' ' && f[i] != 0) return -1;
  return digits ? static_cast<int64_t>(v) : 0;
}

std::string text_field(const uint8_t* f, size_t n) {
  size_t len = 0;
  while (len < n && f[len] != 0) ++len;
  return std::string(reinterpret_cast<const char*>(f), len);
}

bool all_zero(const uint8_t* h) {
  for (size_t i = 0; i < kBlock; ++i)
    if (h[i]) return false;
  return true;
}

// The header checksum: the sum of its bytes with the checksum field read as spaces. Old tars
// summed signed chars; both are accepted, as GNU tar and Python's tarfile accept them.
bool checksum_ok(const uint8_t* h, int64_t stored) {
  int64_t unsigned_sum = 0, signed_sum = 0;
  for (size_t i = 0; i < kBlock; ++i) {
    const bool in_field = i >= 148 && i < 156;
    unsigned_sum += in_field ? ' ' : h[i];
    signed_sum += in_field ? ' ' : static_cast<int8_t>(h[i]);
  }
  return stored == unsigned_sum || stored == signed_sum;
}

// The records of a PAX extended header ("<length> <key>=<value>\n"); the ones that matter here.
void read_pax(const uint8_t* d, size_t n, const std::string& shard, int64_t at, std::string* path, int64_t* size) {
  size_t pos = 0;
  while (pos < n) {
    if (d[pos] == 0) break;  // padding
    size_t sp = pos;
    size_t length = 0;
    while (sp < n && d[sp] >= '0' && d[sp] <= '9') {
      length = length * 10 + static_cast<size_t>(d[sp] - '0');
      if (length > n) bad_tar(shard, at, "a PAX record's length runs past its header");
      ++sp;
    }
    if (sp == pos || sp >= n || d[sp] != ' ' || length == 0 || pos + length > n || d[pos + length - 1] != '\n')
      bad_tar(shard, at, "a malformed PAX extended header");
    const std::string record(reinterpret_cast<const char*>(d + sp + 1), pos + length - 1 - (sp + 1));
    const size_t eq = record.find('=');
    if (eq == std::string::npos) bad_tar(shard, at, "a PAX record without '='");
    const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      *path = value;
    } else if (key == "size") {
      char* end = nullptr;
      errno = 0;
      const long long v = std::strtoll(value.c_str(), &end, 10);
      if (errno || value.empty() || *end || v < 0) bad_tar(shard, at, "a PAX size that is not a number: '" + value + "'");
      *size = v;
    }
    pos += length;
  }
}

int64_t round_up(int64_t n) { return (n + static_cast<int64_t>(kBlock) - 1) / static_cast<int64_t>(kBlock) * static_cast<int64_t>(kBlock); }

}  // namespace

std::vector<TarMember> list_tar_members(const uint8_t* data, size_t size, const std::string& shard) {
  std::vector<TarMember> members;
  const std::string compressed = compression_of(data, size);
  if (!compressed.empty())
    throw std::invalid_argument("tar shard '" + shard + "' is " + compressed + "-compressed: a compressed tar has no "
                                "random access (reading one sample would decompress everything before it), so "
                                "fastload reads uncompressed tars only. Decompress it once (e.g. gunzip -k) and "
                                "read the .tar; shards of already-compressed members (JPEG, PNG, npz) lose little");
  const auto total = static_cast<int64_t>(size);
  int64_t pos = 0;
  std::string long_name, pax_path;
  int64_t pax_size = -1;
  while (pos < total) {
    if (pos + static_cast<int64_t>(kBlock) > total)
      bad_tar(shard, pos, "the file ends inside a header: truncated (" + std::to_string(total) + " bytes)");
    const uint8_t* h = data + pos;
    if (all_zero(h)) break;  // the end-of-archive marker
    const int64_t stored = number_field(h + 148, 8);
    if (stored < 0 || !checksum_ok(h, stored))
      bad_tar(shard, pos, "header checksum mismatch: not a tar file, or corrupt");
    int64_t member_size = number_field(h + 124, 12);
    if (member_size < 0) bad_tar(shard, pos, "a malformed size field");
    const char type = static_cast<char>(h[156]);
    if (pax_size >= 0 && type != 'x' && type != 'L') member_size = pax_size;
    const int64_t data_at = pos + static_cast<int64_t>(kBlock);
    // Entries without data in the archive (links, folders, devices) carry no bytes after the header.
    const bool has_data = !(type == '1' || type == '2' || type == '3' || type == '4' || type == '5' || type == '6');
    const int64_t stored_size = has_data ? member_size : 0;
    if (stored_size > total - data_at)
      bad_tar(shard, pos, "member needs " + std::to_string(stored_size) + " bytes at offset " +
                              std::to_string(data_at) + " but the file ends at " + std::to_string(total) +
                              ": truncated");
    const uint8_t* body = data + data_at;
    if (type == 'x') {  // PAX extended header: applies to the next member
      read_pax(body, static_cast<size_t>(stored_size), shard, pos, &pax_path, &pax_size);
    } else if (type == 'g') {
      // a global PAX header: nothing in it changes where members are
    } else if (type == 'L') {  // GNU long name of the next member
      long_name = text_field(body, static_cast<size_t>(stored_size));
    } else if (type == 'K') {
      // GNU long link name: links are skipped
    } else if (type == 'S') {
      bad_tar(shard, pos, "a GNU sparse member, which fastload does not read (write the tar without --sparse)");
    } else {
      std::string name;
      if (!pax_path.empty()) {
        name = pax_path;
      } else if (!long_name.empty()) {
        name = long_name;
      } else {
        name = text_field(h, 100);
        const std::string prefix = text_field(h + 345, 155);
        if (std::memcmp(h + 257, "ustar\0", 6) == 0 && !prefix.empty()) name = prefix + "/" + name;
      }
      const bool folder = type == '\0' && !name.empty() && name.back() == '/';
      if ((type == '0' || type == '\0' || type == '7') && !folder) members.push_back({name, data_at, member_size});
      long_name.clear();
      pax_path.clear();
      pax_size = -1;
    }
    pos = data_at + round_up(stored_size);
  }
  return members;
}

bool split_tar_member(const std::string& path, std::string* key, std::string* field) {
  const size_t slash = path.rfind('/');
  const size_t start = slash == std::string::npos ? 0 : slash + 1;
  if (slash == std::string::npos && path.size() >= 4 && path.compare(0, 2, "__") == 0 &&
      path.compare(path.size() - 2, 2, "__") == 0)
    return false;  // WebDataset's top-level metadata files
  const size_t dot = path.find('.', start);
  if (dot == std::string::npos || dot == start || dot + 1 == path.size()) return false;
  *key = path.substr(0, dot);
  *field = path.substr(dot + 1);
  for (char& c : *field)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return true;
}

TarSamples group_tar_samples(const std::vector<TarMember>& members, const std::string& shard) {
  TarSamples out;
  out.key_offsets.push_back(0);
  struct Placed {
    int64_t sample, field, offset, size;
  };
  std::vector<Placed> placed;
  placed.reserve(members.size());
  std::unordered_map<std::string, int64_t> field_index;
  std::unordered_set<std::string> seen_keys;
  std::unordered_set<int64_t> current_fields;
  std::string key, field, current;
  bool have_current = false;
  for (const TarMember& m : members) {
    if (!split_tar_member(m.name, &key, &field)) {
      ++out.skipped_members;
      continue;
    }
    if (!have_current || key != current) {
      if (!seen_keys.insert(key).second)
        throw std::invalid_argument("tar shard '" + shard + "': the key '" + key + "' occurs twice (its members are "
                                    "not consecutive): keys must be unique within a shard");
      out.keys += key;
      out.key_offsets.push_back(static_cast<int64_t>(out.keys.size()));
      current = key;
      have_current = true;
      current_fields.clear();
    }
    auto [it, added] = field_index.emplace(field, static_cast<int64_t>(out.fields.size()));
    if (added) out.fields.push_back(field);
    if (!current_fields.insert(it->second).second)
      throw std::invalid_argument("tar shard '" + shard + "': the key '" + key + "' has the field '" + field +
                                  "' twice (member '" + m.name + "')");
    placed.push_back({out.samples() - 1, it->second, m.offset, m.size});
  }
  const size_t cells = static_cast<size_t>(out.samples()) * out.fields.size();
  out.offsets.assign(cells, -1);
  out.sizes.assign(cells, -1);
  for (const Placed& p : placed) {
    const size_t at = static_cast<size_t>(p.sample) * out.fields.size() + static_cast<size_t>(p.field);
    out.offsets[at] = p.offset;
    out.sizes[at] = p.size;
  }
  return out;
}

TarSamples index_tar_file(const std::string& path, int64_t* file_size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::invalid_argument("tar shard '" + path + "': cannot open: " + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    throw std::invalid_argument("tar shard '" + path + "': cannot stat: " + std::strerror(e));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (file_size) *file_size = static_cast<int64_t>(size);
  if (size == 0) {
    ::close(fd);
    return group_tar_samples({}, path);
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int e = errno;
  ::close(fd);
  if (map == MAP_FAILED) throw std::invalid_argument("tar shard '" + path + "': cannot map: " + std::strerror(e));
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, size};
  return group_tar_samples(list_tar_members(static_cast<const uint8_t*>(map), size, path), path);
}

}  // namespace fastload
