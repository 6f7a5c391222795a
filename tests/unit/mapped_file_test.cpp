// MappedFile windows are read into reused buffers and show the file's bytes whatever their
// size; a file cut short under a reader is an error rather than a crash.
#include "io/mapped_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <random>
#include <string>

#include "base/error.h"
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
