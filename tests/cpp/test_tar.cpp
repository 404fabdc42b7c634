// tar_index.h and tar_source.h: tars built byte by byte here (ustar, PAX, GNU long names), every
// prefix of a tar and every corrupted header byte (an error or a result, never a read outside
// the buffer: ASan), and TarSource filled from several threads at once through LazyFiles with a
// budget of one mapping (pins, evictions and identity checks under TSan).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <thread>

#include "core/arrow_gather.h"
#include "core/tar_index.h"
#include "harness.h"
#include "image/tar_source.h"

using namespace fastload;

namespace {

std::string octal(int64_t v, size_t width) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%0*llo", static_cast<int>(width - 1), static_cast<long long>(v));
  return std::string(buf);
}

// One header block (checksum filled in).
std::string header(const std::string& name, int64_t size, char type = '0', const std::string& prefix = "") {
  std::string h(512, '\0');
  h.replace(0, std::min<size_t>(name.size(), 100), name.substr(0, 100));
  h.replace(100, 7, "0000644");
  h.replace(124, 11, octal(size, 12));
  h.replace(136, 11, octal(0, 12));
  h[156] = type;
  h.replace(257, 6, std::string("ustar\0", 6));
  h.replace(263, 2, "00");
  h.replace(345, prefix.size(), prefix);
  h.replace(148, 8, "        ");
  int64_t sum = 0;
  for (unsigned char c : h) sum += c;
  h.replace(148, 7, octal(sum, 7) + std::string(1, '\0'));
  h[155] = ' ';
  return h;
}

std::string padded(const std::string& data) { return data + std::string((512 - data.size() % 512) % 512, '\0'); }

std::string member(const std::string& name, const std::string& data, char type = '0', const std::string& prefix = "") {
  return header(name, static_cast<int64_t>(data.size()), type, prefix) + padded(data);
}

std::string pax_record(const std::string& key, const std::string& value) {
  const std::string body = " " + key + "=" + value + "\n";
  size_t n = body.size() + 1;
  while (std::to_string(n).size() + body.size() != n) ++n;
  return std::to_string(n) + body;
}

std::string end_marker() { return std::string(1024, '\0'); }

const uint8_t* bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

std::string sample_tar() {
  const std::string long_name = std::string(120, 'd') + ".dir/" + std::string(130, 'n') + ".TXT";
  return member("a.cls", "3\n") + member("a.txt", "hello") +
         member("././@LongLink", long_name, 'L') + member("ignored", "long one") +
         member("paxheader", pax_record("path", "pax.dir/b.json") + pax_record("size", "2"), 'x') +
         member("short", "{}") + member("c.d/e.f/k.cls", "7") + member("folder/", "", '5') +
         member("k.cls", "9", '0', "pre.fix") + end_marker();
}

}  // namespace

TEST_CASE(members_of_ustar_pax_and_gnu_headers) {
  const std::string tar = sample_tar();
  const auto m = list_tar_members(bytes(tar), tar.size(), "t.tar");
  CHECK(m.size() == 6);
  if (m.size() != 6) return;
  CHECK(m[0].name == "a.cls" && m[0].offset == 512 && m[0].size == 2);
  CHECK(m[1].name == "a.txt" && tar.substr(static_cast<size_t>(m[1].offset), 5) == "hello");
  CHECK(m[2].name == std::string(120, 'd') + ".dir/" + std::string(130, 'n') + ".TXT" && m[2].size == 8);
  CHECK(m[3].name == "pax.dir/b.json" && m[3].size == 2 && tar.substr(static_cast<size_t>(m[3].offset), 2) == "{}");
  CHECK(m[4].name == "c.d/e.f/k.cls");
  CHECK(m[5].name == "pre.fix/k.cls");
}

TEST_CASE(grouping_follows_webdatasets_rule) {
  std::string key, field;
  CHECK(split_tar_member("a.b/c.d/img1.Seg.PNG", &key, &field) && key == "a.b/c.d/img1" && field == "seg.png");
  CHECK(!split_tar_member("noext", &key, &field));
  CHECK(!split_tar_member("dir/.hidden", &key, &field));
  CHECK(!split_tar_member("__index__", &key, &field));
  CHECK(!split_tar_member("a.", &key, &field));
  const std::string tar = sample_tar();
  const TarSamples s = group_tar_samples(list_tar_members(bytes(tar), tar.size(), "t.tar"), "t.tar");
  CHECK(s.samples() == 5);  // a, the long one, pax.dir/b, c.d/e.f/k, pre.fix/k
  CHECK(s.fields.size() == 3);  // cls, txt, json
  CHECK(s.offsets.size() == 15 && s.offsets[2] == -1 && s.offsets[0] == 512);
  std::vector<TarMember> dup = {{"a.cls", 0, 1}, {"b.cls", 0, 1}, {"a.txt", 0, 1}};
  CHECK_THROWS(group_tar_samples(dup, "d.tar"), std::invalid_argument, "key 'a' occurs twice");
  std::vector<TarMember> twice = {{"a.cls", 0, 1}, {"a.CLS", 0, 1}};
  CHECK_THROWS(group_tar_samples(twice, "d.tar"), std::invalid_argument, "field 'cls' twice");
}

TEST_CASE(every_prefix_is_a_result_or_an_error) {
  const std::string tar = sample_tar();
  int errors = 0;
  for (size_t n = 0; n <= tar.size(); ++n) {
    const std::string cut = tar.substr(0, n);  // its own allocation: ASan sees reads past it
    try {
      list_tar_members(bytes(cut), cut.size(), "cut.tar");
    } catch (const std::invalid_argument& e) {
      ++errors;
      CHECK_MSG(std::string(e.what()).find("cut.tar") != std::string::npos, e.what());
    }
  }
  CHECK(errors > 0);
}

TEST_CASE(every_corrupted_header_byte_is_a_result_or_an_error) {
  const std::string tar = sample_tar();
  for (size_t at = 0; at < tar.size() - 1024; ++at) {
    std::string bad = tar;
    bad[at] = static_cast<char>(bad[at] ^ 0xA5);
    try {
      list_tar_members(bytes(bad), bad.size(), "bad.tar");
    } catch (const std::invalid_argument&) {
    }
  }
  std::string bad = tar;
  bad[512 + 512 + 3] ^= 1;  // the second header's name
  CHECK_THROWS(list_tar_members(bytes(bad), bad.size(), "bad.tar"), std::invalid_argument,
               "checksum mismatch: not a tar file, or corrupt (header at offset 1024)");
  const std::string gz = "\x1f\x8b\x08" + std::string(600, '\0');
  CHECK_THROWS(list_tar_members(bytes(gz), gz.size(), "z.tar"), std::invalid_argument, "gzip-compressed");
}

TEST_CASE(tar_source_filled_from_threads) {
  std::string tar;
  const int n = 300;
  for (int i = 0; i < n; ++i) tar += member("k" + std::to_string(i) + ".cls", std::to_string(i)) +
                                     member("k" + std::to_string(i) + ".txt", "t" + std::to_string(i));
  tar += end_marker();
  char path[] = "/tmp/fastload_test_tar_XXXXXX";
  const int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(::write(fd, tar.data(), tar.size()) == static_cast<ssize_t>(tar.size()));
  ::close(fd);
  int64_t size = 0;
  const TarSamples s = index_tar_file(path, &size);
  CHECK(s.samples() == n && size == static_cast<int64_t>(tar.size()));
  struct stat st;
  ::stat(path, &st);
  LazyFile file;
  file.path = path;
  file.bytes = size;
  file.identity = {static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino), mtime_ns(st), size};
  auto files = std::make_shared<LazyFiles>(std::make_shared<MappingCache>(1), std::vector<LazyFile>{file});
  image::TarSampleTable table;
  table.shards = {path};
  table.shard_sizes = {size};
  table.shard_files = {0};
  table.shard_starts = {0, n};
  table.offsets = s.offsets.data();
  table.sizes = s.sizes.data();
  table.columns = 2;
  table.keys = s.keys.data();
  table.key_offsets = s.key_offsets.data();
  auto field = [](const char* name, image::TarFieldKind kind, int64_t column) {
    image::TarField f;
    f.name = name;
    f.kind = kind;
    f.column = column;
    return f;
  };
  const image::TarField cls = field("cls", image::TarFieldKind::kInt, 0);
  const image::TarField txt = field("txt", image::TarFieldKind::kText, 1);
  const image::TarField key = field("__key__", image::TarFieldKind::kKey, -1);
  image::TarSource source(table, files, {cls, txt, key}, nullptr);
  CHECK(source.schema().size() == 1 && source.has_string_lists());
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int64_t> ids, out(32);
      for (int i = 0; i < 32; ++i) ids.push_back((t * 71 + i * 13) % n);
      std::byte* parts[] = {reinterpret_cast<std::byte*>(out.data())};
      std::shared_ptr<void> extras;
      FillRequest r;
      r.ids = ids.data();
      r.count = 32;
      r.parts = parts;
      r.extras = &extras;
      source.fill(r);
      const auto* lists = static_cast<const ArrowStringLists*>(extras.get());
      for (int i = 0; i < 32; ++i) {
        const std::string want = "t" + std::to_string(ids[i]);
        const auto& o = lists->offsets[0];
        const std::string got(lists->bytes[0].data() + o[i], static_cast<size_t>(o[i + 1] - o[i]));
        const auto& ko = lists->offsets[1];
        const std::string got_key(lists->bytes[1].data() + ko[i], static_cast<size_t>(ko[i + 1] - ko[i]));
        if (out[i] != ids[i] || got != want || got_key != "k" + std::to_string(ids[i])) ++bad;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(bad.load() == 0);
  // A rewritten shard (another size) is refused by a fresh source, never read with the old index.
  const int fd2 = ::open(path, O_WRONLY | O_APPEND);
  CHECK(::write(fd2, "x", 1) == 1);
  ::close(fd2);
  auto stale_files = std::make_shared<LazyFiles>(std::make_shared<MappingCache>(1), std::vector<LazyFile>{file});
  image::TarSource stale(table, stale_files, {cls}, nullptr);
  std::vector<int64_t> ids = {0}, out(1);
  std::byte* parts[] = {reinterpret_cast<std::byte*>(out.data())};
  FillRequest r;
  r.ids = ids.data();
  r.count = 1;
  r.parts = parts;
  CHECK_THROWS(stale.fill(r), std::invalid_argument, path);
  ::unlink(path);
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_tar"); }
