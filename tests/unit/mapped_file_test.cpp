// MappedFile windows are read into reused buffers and show the file's bytes whatever their
// size; ranges streamed or hashed in runs (range_stream.h) too; a file cut short under a
// reader is an error rather than a crash.
#include "io/mapped_file.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <random>
#include <string>

#include "base/error.h"
#include "io/crc32.h"
#include "io/range_stream.h"
#include "test_util.h"

namespace ckpt {
namespace {

std::string Text(Bytes b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  std::mt19937_64 rng(7);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

TEST(MappedFileWindowTest, EveryWindowShowsTheFileBytesWhateverItsSize) {
  test::TempDir dir;
  std::string data = Pattern(5u << 20);
  MappedFile m = MappedFile::Open(dir.Put("f.bin", data));
  std::mt19937_64 rng(11);
  // Small and large, at odd offsets.
  for (uint64_t size : {1ull, 4095ull, 65535ull, 65536ull, 65537ull, 1ull << 20, 5ull << 20}) {
    for (int i = 0; i < 20; ++i) {
      uint64_t off = rng() % (data.size() - size + 1);
      MappedFile::Window w(m, off, size);
      ASSERT_EQ(Text(w.bytes()), data.substr(off, size)) << off << "+" << size;
    }
  }
  MappedFile::Window all(m, 0, data.size());
  EXPECT_EQ(Text(all.bytes()), data);
}

TEST(RangeStreamTest, StreamsAndCrcsOfRangesEqualTheFileBytesAndChecksNameTheFirstMismatch) {
  test::TempDir dir;
  std::string data = Pattern(3u << 20);
  MappedFile m = MappedFile::Open(dir.Put("f.bin", data));
  // StreamRange hands out consecutive windows of at most the chunk size.
  std::string seen;
  uint64_t windows = 0;
  StreamRange(m, 12345, (1u << 20) + 7, [&](uint64_t off, Bytes b) {
    EXPECT_EQ(off, seen.size());
    EXPECT_LE(b.size(), kStreamChunk);
    seen += Text(b);
    ++windows;
  });
  EXPECT_EQ(seen, data.substr(12345, (1u << 20) + 7));
  EXPECT_EQ(windows, (1u << 20) / kStreamChunk + 1);
  // Ranges of every kind: tiny and close together (read in runs), touching, overlapping,
  // empty, out of order, far apart, larger than a run.
  std::mt19937_64 rng(5);
  std::vector<FileRange> ranges;
  for (uint64_t at = 1000; ranges.size() < 3000; at += 300 + rng() % 200)
    ranges.push_back({at, 1 + rng() % 300});
  ranges.push_back({0, 0});
  ranges.push_back({5000, 100000});  // overlaps many small ones
  ranges.push_back({2u << 20, 1u << 20});
  ranges.push_back({77, 64});
  ranges.push_back({(3u << 20) - 10, 10});
  std::shuffle(ranges.begin(), ranges.end(), rng);
  for (unsigned threads : {1u, 3u}) {
    std::vector<uint32_t> crcs = Crc32OfRanges(m, ranges, threads);
    ASSERT_EQ(crcs.size(), ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_EQ(crcs[i], Crc32(0, test::B(data.substr(ranges[i].offset, ranges[i].size))))
          << ranges[i].offset << "+" << ranges[i].size;
    }
  }
  // A range past the end is an error, not a read of other memory.
  EXPECT_THROW(Crc32OfRanges(m, {{data.size() - 5, 10}}, 1), Error);
  // CrcChecks: the id of the first range (in the order added) whose CRC differs, none when
  // every one holds.
  for (size_t wrong : {size_t{1000}, size_t{2999}, ranges.size()}) {
    CrcChecks checks;
    for (size_t i = 0; i < ranges.size(); ++i) {
      uint32_t crc = Crc32(0, test::B(data.substr(ranges[i].offset, ranges[i].size)));
      checks.Add(ranges[i].offset, ranges[i].size, i >= wrong ? crc ^ 1 : crc, 7 * i);
    }
    std::vector<size_t> mismatched;
    std::string error = test::ErrorOf([&] {
      checks.Run(m, 3, [&](size_t id) {
        mismatched.push_back(id);
        Fail("range {} differs", id);
      });
    });
    if (wrong == ranges.size()) {
      EXPECT_EQ(error, "");
      EXPECT_TRUE(mismatched.empty());
    } else {
      EXPECT_EQ(error, fmt::format("range {} differs", 7 * wrong));
      EXPECT_EQ(mismatched, std::vector<size_t>{7 * wrong});
    }
  }
}

TEST(MappedFileWindowTest, WindowsAliveTogetherHaveTheirOwnBytesAndBuffersAreReused) {
  test::TempDir dir;
  std::string data = Pattern(3u << 20);
  MappedFile m = MappedFile::Open(dir.Put("f.bin", data));
  const uint8_t* first = nullptr;
  const uint8_t* second = nullptr;
  {
    MappedFile::Window a(m, 0, 1u << 20);
    MappedFile::Window b(m, 1u << 20, 1u << 20);
    EXPECT_NE(a.bytes().data(), b.bytes().data());
    EXPECT_EQ(Text(a.bytes()), data.substr(0, 1u << 20));
    EXPECT_EQ(Text(b.bytes()), data.substr(1u << 20, 1u << 20));
    first = a.bytes().data();
    second = b.bytes().data();
  }
  // A later, smaller window on this thread reads into a buffer given back before.
  MappedFile::Window c(m, 2u << 20, 512u << 10);
  EXPECT_EQ(Text(c.bytes()), data.substr(2u << 20, 512u << 10));
  EXPECT_TRUE(c.bytes().data() == first || c.bytes().data() == second);
  // Small windows too are read into a buffer, not served from the mapping (whose pages
  // would stay resident).
  MappedFile::Window small(m, 100, 1000);
  EXPECT_EQ(Text(small.bytes()), data.substr(100, 1000));
  EXPECT_NE(small.bytes().data(), m.bytes().data() + 100);
}

TEST(MappedFileWindowTest, AFileCutShortWhileOpenIsAnErrorNamingIt) {
  test::TempDir dir;
  std::string path = dir.Put("f.bin", Pattern(2u << 20));
  MappedFile m = MappedFile::Open(path);
  ASSERT_EQ(::truncate(path.c_str(), 1u << 20), 0);
  std::string error = test::ErrorOf([&] { MappedFile::Window w(m, (1u << 20) - 4096, 1u << 20); });
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find("truncated while being read"), std::string::npos) << error;
  EXPECT_THROW(MappedFile::Window(m, (1u << 20) - 4096, 1u << 20), InputChanged);
  // What is still there reads as before.
  MappedFile::Window before(m, 0, 1u << 20);
  EXPECT_EQ(before.bytes().size(), 1u << 20);
}

}  // namespace
}  // namespace ckpt
