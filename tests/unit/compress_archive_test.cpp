// .ckz archives end to end: round trips of real fixtures, every truncation refused, flipped
// bytes refused by a checksum (or harmless), a lying index (re-sealed with valid checksums)
// refused or caught by the chunk checksums, and decompress never leaving a wrong file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "base/endian.h"
#include "compress/archive.h"
#include "compress/archive_volume.h"
#include "compress/format.h"
#include "compress/layout.h"
#include "engines/compress.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string Get(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void Put(const std::string& path, const std::string& data) {
  std::ofstream(path, std::ios::binary) << data;
}

// Every chunk decoded in order: the restored bytes of a one-file archive, or an error.
std::string DecodeAll(const ckz::Archive& a) {
  ckz::ChunkCoder coder;
  std::string out;
  for (size_t k = 0; k < a.index().chunks.size(); ++k) {
    std::string buf(a.index().chunks[k].length, '\0');
    a.DecodeChunk(coder, k, reinterpret_cast<uint8_t*>(buf.data()));
    out += buf;
  }
  return out;
}

ckz::Index RawIndex(const std::string& archive) {
  Bytes b = test::B(archive);
  ckz::TrailerInfo t = ckz::ParseTrailer(b);
  std::string raw(t.index_raw, '\0');
  ZSTD_decompress(raw.data(), raw.size(), archive.data() + t.index_offset, t.index_frame);
  return ckz::ParseIndex(test::B(raw), archive.size(), t.index_offset);
}

// The archive with its index replaced and every index checksum made valid again.
std::string Reseal(const std::string& archive, const ckz::Index& index) {
  ckz::TrailerInfo t = ckz::ParseTrailer(test::B(archive));
  std::string raw = ckz::SerializeIndex(index);
  std::string frame(ZSTD_compressBound(raw.size()), '\0');
  frame.resize(ZSTD_compress(frame.data(), frame.size(), raw.data(), raw.size(), 3));
  std::string out = archive.substr(0, t.index_offset) + frame;
  out += ckz::Trailer(t.index_offset, frame.size(), raw.size(), Crc32(0, test::B(frame)));
  return out;
}

class CompressArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-ckz-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Compresses `data` saved as `name`; returns the archive's bytes.
  std::string Archive(const std::string& name, const std::string& data,
                      ckz::Level level = ckz::Level::kFast) {
    Put(Path(name), data);
    CompressOptions o;
    o.level = level;
    o.threads = 2;
    o.force = true;
    CompressResult r = CompressPath(Path(name), o);
    EXPECT_EQ(r.output, Path(name) + ".ckz");
    return Get(r.output);
  }

  std::string dir_;
};

// A safetensors file of an f32 and a bf16 tensor of real-looking values (normal, 0.02).
std::string MixedFile(size_t f32_elems, size_t bf16_elems, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::string header = fmt::format(
      R"({{"a":{{"dtype":"F32","shape":[{}],"data_offsets":[0,{}]}},)"
      R"("b":{{"dtype":"BF16","shape":[{}],"data_offsets":[{},{}]}}}})",
      f32_elems, 4 * f32_elems, bf16_elems, 4 * f32_elems, 4 * f32_elems + 2 * bf16_elems);
  while (header.size() % 8) header += ' ';
  std::string out;
  AppendLE<uint64_t>(out, header.size());
  out += header;
  for (size_t i = 0; i < f32_elems; ++i) {
    float f = normal(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    AppendLE<uint32_t>(out, b);
  }
  for (size_t i = 0; i < bf16_elems; ++i) {
    float f = normal(rng);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    AppendLE<uint16_t>(out, static_cast<uint16_t>(b >> 16));
  }
  return out;
}

TEST_F(CompressArchiveTest, FixturesRoundTripBitExactAndTheirTensorsAreFound) {
  for (const char* name : {"small.pt", "small_legacy.pt", "small.safetensors"}) {
    SCOPED_TRACE(name);
    std::string data = test::ReadFixture(name);
    ckz::FileLayout layout = ckz::AnalyzeFile(test::B(data));
    EXPECT_NE(layout.format, ckz::FileFormat::kOther);
    EXPECT_FALSE(layout.ranges.empty());
    EXPECT_FALSE(layout.tensors.empty());
    for (ckz::Level level : {ckz::Level::kFast, ckz::Level::kMax}) {
      std::string archive = Archive(name, data, level);
      ckz::Archive a = ckz::Archive::FromBytes(test::B(archive), "x.ckz");
      EXPECT_EQ(DecodeAll(a), data);
      DecompressOptions d;
      d.output = Path(std::string(name) + ".out");
      d.force = true;
      DecompressArchive(Path(name) + ".ckz", d);
      EXPECT_EQ(Get(d.output), data);
    }
  }
}

TEST_F(CompressArchiveTest, LargeMixedFileRoundTripsAndIsSmallerThanTheInput) {
  std::string data = MixedFile(700000, 900000, 1);
  std::string archive = Archive("mixed.bin", data);
  ckz::Archive a = ckz::Archive::FromBytes(test::B(archive), "mixed.ckz");
  EXPECT_GT(a.index().chunks.size(), 3u);
  EXPECT_EQ(DecodeAll(a), data);
  // Exponents coded apart: well below the input.
  EXPECT_LT(archive.size(), data.size() * 0.85);
  EXPECT_EQ(a.index().entries[0].format, ckz::FileFormat::kSafetensors);
  EXPECT_EQ(a.index().entries[0].ranges.size(), 2u);
  ArchiveVerifyResult v = VerifyArchive(a, 2);
  EXPECT_TRUE(v.problems.empty());
  EXPECT_EQ(v.bytes, data.size());
}

TEST_F(CompressArchiveTest, AMemberHoldsThePlainBytesAndWindowsReadTheTensorsFromTheChunks) {
  std::string data = MixedFile(700000, 900000, 2);  // 4.6 MiB of tensors, a 150-byte header
  Archive("mixed.bin", data);
  const uint64_t header = 8 + LoadLE<uint64_t>(reinterpret_cast<const uint8_t*>(data.data()));
  const std::string root = Path("mixed.bin.ckz") + "/mixed.bin";
  auto v = ckz::ArchiveVolume::Open(Path("mixed.bin.ckz"), root, 2);
  EXPECT_EQ(v->plain_bytes(), header);
  EXPECT_EQ(v->tensor_bytes(), data.size() - header);
  EXPECT_EQ(v->TypeOf(root), NodeType::kFile);
  EXPECT_EQ(v->TypeOf(root + "/x"), NodeType::kMissing);
  EXPECT_EQ(v->TypeOf(Path("mixed.bin")), NodeType::kMissing);  // not below the root
  MappedFile m = v->Open(root);
  EXPECT_EQ(m.size(), data.size());
  EXPECT_EQ(m.fd(), -1);                             // nothing for the kernel to copy from
  EXPECT_EQ(m.stamp().path, Path("mixed.bin.ckz"));  // writers check the archive
  // The mapping: the header, then zeros where the tensors are.
  EXPECT_EQ(AsText(m.bytes().subspan(0, header)), data.substr(0, header));
  EXPECT_EQ(m.bytes()[header + 1000], 0);
  // Through windows, Read and Reach: every byte, at any offset and length, across chunks.
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    uint64_t off = rng() % data.size();
    uint64_t len = 1 + rng() % std::min<uint64_t>(data.size() - off, 3u << 20);
    MappedFile::Window w(m, off, len);
    ASSERT_EQ(AsText(w.bytes()), data.substr(off, len)) << off << "+" << len;
    std::string read(len, '\0');
    m.Read(off, reinterpret_cast<uint8_t*>(read.data()), len);
    ASSERT_EQ(read, data.substr(off, len)) << off << "+" << len;
  }
  MappedFile::Window all(m, 0, data.size());
  EXPECT_EQ(AsText(all.bytes()), data);
  MappedFile::Reach reach(m, header + 1000, 3u << 20);
  EXPECT_EQ(AsText(reach.bytes()), data.substr(header + 1000, 3u << 20));
  // Released pages of a member are not dropped: they are its only copy.
  m.Release(0, data.size());
  EXPECT_EQ(AsText(m.bytes().subspan(0, header)), data.substr(0, header));
  // Nothing was written beside the archive.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"mixed.bin", "mixed.bin.ckz"}));
}

TEST_F(CompressArchiveTest, AFolderArchiveIsAVolumeItsLinksFollowedOnlyInside) {
  fs::create_directories(Path("run/ckpt/sub"));
  std::string data = MixedFile(3000, 5000, 9);
  Put(Path("run/ckpt/model.safetensors"), data);
  Put(Path("run/ckpt/sub/notes.txt"), "hello");
  Put(Path("run/outside.txt"), "secret");
  fs::create_symlink("ckpt/model.safetensors", Path("run/last"));
  fs::create_symlink("../outside.txt", Path("run/ckpt/up"));      // inside: run/outside.txt
  fs::create_symlink("../../outside.txt", Path("run/ckpt/out"));  // leaves the archive
  fs::create_symlink("/etc/passwd", Path("run/abs"));
  fs::create_symlink("ckpt", Path("run/dir"));
  CompressOptions o;
  o.threads = 2;
  CompressResult r = CompressPath(Path("run"), o);
  fs::remove_all(Path("run"));
  const std::string root = r.output + "/run";
  auto v = ckz::ArchiveVolume::Open(r.output, root, 2);
  std::vector<std::string> top;
  for (const Node& n : v->List(root)) top.push_back(n.path.substr(root.size() + 1));
  EXPECT_EQ(top, (std::vector<std::string>{"abs", "ckpt", "dir", "last", "outside.txt"}));
  EXPECT_EQ(v->LinkTypeOf(root + "/last"), NodeType::kSymlink);
  EXPECT_EQ(v->TypeOf(root + "/last"), NodeType::kFile);
  EXPECT_EQ(v->TypeOf(root + "/dir"), NodeType::kFolder);
  EXPECT_EQ(v->TypeOf(root + "/dir/sub/notes.txt"), NodeType::kFile);
  EXPECT_EQ(v->TypeOf(root + "/ckpt/up"), NodeType::kFile);
  EXPECT_EQ(v->TypeOf(root + "/ckpt/out"), NodeType::kMissing);
  EXPECT_EQ(v->TypeOf(root + "/abs"), NodeType::kMissing);
  EXPECT_EQ(v->TypeOf(root + "/ckpt/../../x"), NodeType::kMissing);
  EXPECT_THROW(v->Open(root + "/abs"), Error);
  EXPECT_THROW(v->List(root + "/last"), Error);
  EXPECT_EQ(v->ReadText(root + "/dir/sub/notes.txt", 100), "hello");
  EXPECT_EQ(v->ReadText(root + "/ckpt/up", 100), "secret");
  MappedFile m = v->Open(root + "/last");
  MappedFile::Window w(m, 0, m.size());
  EXPECT_EQ(AsText(w.bytes()), data);
  // A walk: depth first in name order, links not followed.
  std::vector<std::string> walked;
  v->Walk(root, [&](const Node& n) { walked.push_back(n.path.substr(root.size() + 1)); });
  EXPECT_EQ(walked, (std::vector<std::string>{"abs", "ckpt", "ckpt/model.safetensors", "ckpt/out",
                                              "ckpt/sub", "ckpt/sub/notes.txt", "ckpt/up", "dir",
                                              "last", "outside.txt"}));
}

TEST_F(CompressArchiveTest, AnEmptyFileWhoseChecksumIsNotZeroIsDamageToVerifyAndDecompress) {
  std::string archive = Archive("notes.txt", "");  // (an empty .bin would be a cut checkpoint)
  ckz::Index index = RawIndex(archive);
  ASSERT_EQ(index.entries[0].chunk_count, 0u);
  index.entries[0].crc = 1;
  Put(Path("bad.ckz"), Reseal(archive, index));
  // verify says what decompress refuses, in the same words.
  ArchiveVerifyResult v = VerifyArchive(ckz::Archive::Open(Path("bad.ckz")), 1);
  ASSERT_EQ(v.problems.size(), 1u);
  EXPECT_EQ(v.problems[0].what, "the empty file's checksum is not 0");
  DecompressOptions d;
  d.output = Path("restored.bin");
  try {
    DecompressArchive(Path("bad.ckz"), d);
    ADD_FAILURE() << "restored a damaged archive";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the empty file's checksum is not 0"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(Path("restored.bin")));
}

TEST_F(CompressArchiveTest, CopyingAMemberCopiesItsTensorsNotItsZeros) {
  std::string data = MixedFile(700000, 900000, 4);
  Archive("mixed.bin", data);
  auto v = ckz::ArchiveVolume::Open(Path("mixed.bin.ckz"), Path("mixed.bin.ckz") + "/held.bin", 2);
  MappedFile m = v->Open(Path("mixed.bin.ckz") + "/held.bin");
  {
    AtomicOutput out = AtomicOutput::Create(Path("copy.bin"), m.size());
    out.CopyFrom(m, 0, 0, 1000);  // the header and the first tensor bytes
    out.CopyFrom(m, 1000, 1000, m.size() - 1000);
    out.Commit();
  }
  EXPECT_EQ(Get(Path("copy.bin")), data);
}

TEST_F(CompressArchiveTest, AMemberRefusesADamagedTensorChunkWhenItIsRead) {
  std::string data = MixedFile(700000, 0, 3);
  std::string archive = Archive("f32.bin", data);
  ckz::Archive a = ckz::Archive::FromBytes(test::B(archive), "f32.ckz");
  ASSERT_GT(a.index().chunks.size(), 2u);
  const ckz::Chunk& last = a.index().chunks.back();  // tensor bytes only
  archive[last.archive_offset + last.stored_bytes() - 100] ^= 0x10;
  Put(Path("bad.ckz"), archive);
  auto v = ckz::ArchiveVolume::Open(Path("bad.ckz"), Path("bad.ckz") + "/f32.bin", 1);
  MappedFile m = v->Open(Path("bad.ckz") + "/f32.bin");  // the header is fine
  {
    MappedFile::Window first(m, 0, 1000);
    EXPECT_EQ(AsText(first.bytes()), data.substr(0, 1000));
  }
  try {
    MappedFile::Window w(m, data.size() - 10, 10);
    FAIL() << "a damaged chunk was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.ckz: f32.bin: chunk"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tensor 'a'"), std::string::npos) << e.what();
  }
}

TEST_F(CompressArchiveTest, EmptyFileRoundTrips) {
  std::string archive = Archive("empty", "");
  ckz::Archive a = ckz::Archive::FromBytes(test::B(archive), "empty.ckz");
  EXPECT_EQ(a.index().chunks.size(), 0u);
  DecompressOptions d;
  d.output = Path("empty.out");
  DecompressArchive(Path("empty.ckz"), d);
  EXPECT_TRUE(fs::exists(d.output));
  EXPECT_EQ(fs::file_size(d.output), 0u);
}

TEST_F(CompressArchiveTest, EveryTruncationIsRefused) {
  std::string archive = Archive("small.pt", test::ReadFixture("small.pt"));
  for (size_t n = 0; n < archive.size(); ++n) {
    EXPECT_NE(test::ErrorOf([&] { ckz::Archive::FromBytes(test::B(archive.substr(0, n)), "t"); }),
              "")
        << "truncated to " << n << " of " << archive.size() << " bytes";
  }
}

TEST_F(CompressArchiveTest, EveryFlippedByteIsRefusedOrHarmless) {
  std::string data = test::ReadFixture("small.pt");
  std::string archive = Archive("small.pt", data);
  size_t refused = 0;
  for (size_t i = 0; i < archive.size(); ++i) {
    for (uint8_t bit : {0x01, 0x80}) {
      std::string bad = archive;
      bad[i] = static_cast<char>(bad[i] ^ bit);
      std::string restored;
      std::string err = test::ErrorOf([&] {
        ckz::Archive a = ckz::Archive::FromBytes(test::B(bad), "flip.ckz");
        ArchiveVerifyResult v = VerifyArchive(a, 1);
        if (!v.problems.empty()) Fail("{}", v.problems[0].what);
        restored = DecodeAll(a);
      });
      if (err.empty()) {
        EXPECT_EQ(restored, data) << "flip at " << i << " restored other bytes unnoticed";
      } else {
        ++refused;
      }
    }
  }
  EXPECT_GT(refused, archive.size());
}

TEST_F(CompressArchiveTest, ALyingIndexIsRefused) {
  std::string data = MixedFile(200000, 300000, 2);
  std::string archive = Archive("lie.bin", data);
  ckz::Index good = RawIndex(archive);
  ASSERT_GE(good.chunks.size(), 2u);
  using Edit = std::function<void(ckz::Index&)>;
  std::vector<std::pair<std::string, Edit>> lies = {
      {"chunk checksum", [](ckz::Index& i) { i.chunks[1].crc ^= 1; }},
      {"file checksum", [](ckz::Index& i) { i.entries[0].crc ^= 1; }},
      {"chunk length", [](ckz::Index& i) { i.chunks[0].length += 1; }},
      {"chunk offset in the file", [](ckz::Index& i) { i.chunks[1].offset -= 4; }},
      {"chunk position in the archive", [](ckz::Index& i) { i.chunks[1].archive_offset += 1; }},
      {"plane size", [](ckz::Index& i) { i.chunks[0].planes[0].stored -= 1; }},
      {"plane method",
       [](ckz::Index& i) {
         i.chunks[0].planes[0].method = i.chunks[0].planes[0].method == ckz::Method::kRaw
                                            ? ckz::Method::kLz
                                            : ckz::Method::kRaw;
       }},
      {"file size", [](ckz::Index& i) { i.entries[0].size += 1; }},
      {"a typed range dropped", [](ckz::Index& i) { i.entries[0].ranges.pop_back(); }},
      {"bf16 range said to be f16",
       [](ckz::Index& i) { i.entries[0].ranges[1].transform = ckz::Transform::kF16; }},
      {"f32 range said to be bf16",
       [](ckz::Index& i) { i.entries[0].ranges[0].transform = ckz::Transform::kBF16; }},
      {"unsafe path", [](ckz::Index& i) { i.entries[0].path = "../evil"; }},
      {"chunk moved to another file", [](ckz::Index& i) { i.chunks[0].file = 1; }},
  };
  for (auto& [what, edit] : lies) {
    SCOPED_TRACE(what);
    ckz::Index lie = good;
    edit(lie);
    std::string bad = Reseal(archive, lie);
    std::string restored;
    std::string err = test::ErrorOf([&] {
      ckz::Archive a = ckz::Archive::FromBytes(test::B(bad), "lie.ckz");
      ArchiveVerifyResult v = VerifyArchive(a, 2);
      if (!v.problems.empty())
        Fail("{}: {}: {}", a.name(), v.problems[0].where, v.problems[0].what);
      restored = DecodeAll(a);
    });
    EXPECT_NE(err, "") << "the lie went unnoticed";
    EXPECT_NE(err.find("lie.ckz"), std::string::npos) << err;
  }
  // The untouched index re-sealed is fine (the test's own machinery is right).
  std::string resealed = Reseal(archive, good);
  ckz::Archive a = ckz::Archive::FromBytes(test::B(resealed), "ok.ckz");
  EXPECT_EQ(DecodeAll(a), data);
}

TEST_F(CompressArchiveTest, AFolderArchiveCannotEscapeThroughASymlink) {
  // Folder archive with a symlink "a" and a file "a/x": the index must refuse it.
  fs::create_directories(Path("tree"));
  Put(Path("tree/f"), "hello");
  fs::create_symlink("/tmp", Path("tree/a"));
  CompressOptions o;
  o.threads = 1;
  CompressResult r = CompressPath(Path("tree"), o);
  std::string archive = Get(r.output);
  ckz::Index index = RawIndex(archive);
  ASSERT_EQ(index.entries.size(), 3u);  // "", "a", "f"
  index.entries[2].path = "a/f";
  std::string err =
      test::ErrorOf([&] { ckz::Archive::FromBytes(test::B(Reseal(archive, index)), "s.ckz"); });
  EXPECT_NE(err.find("not listed before it"), std::string::npos) << err;
}

TEST_F(CompressArchiveTest, DecompressNeverLeavesAWrongOrPartialFile) {
  std::string data = MixedFile(400000, 0, 3);
  Archive("big.bin", data);
  std::string archive = Get(Path("big.bin.ckz"));
  ckz::Index index = RawIndex(archive);
  // Damage the last chunk's planes: every other chunk decodes fine first.
  const ckz::Chunk& last = index.chunks.back();
  archive[last.archive_offset + ckz::ChunkHeaderSize(last.planes.size()) + 10] ^= 0x55;
  Put(Path("bad.ckz"), archive);
  DecompressOptions d;
  d.threads = 2;
  std::string err = test::ErrorOf([&] { DecompressArchive(Path("bad.ckz"), d); });
  EXPECT_NE(err.find("bad.ckz"), std::string::npos) << err;
  EXPECT_NE(err.find("big.bin: chunk"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(Path("bad")));
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("ckptool-tmp"), std::string::npos) << e.path();
}

TEST(CompressLayoutTest, ChunksTileTheFileAtElementBoundariesWithinTheSizeLimits) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    uint64_t size = rng() % (8 << 20);
    std::vector<ckz::TypedRange> ranges;
    uint64_t pos = rng() % 1000;
    while (pos < size) {
      ckz::Transform t = static_cast<ckz::Transform>(1 + rng() % 4);
      uint64_t es = ckz::ElementBytes(t);
      uint64_t len = es * (1 + rng() % ((round % 3 == 0 ? 3u << 20 : 40000u) / es));
      if (pos + len > size) break;
      ranges.push_back({pos, len, t});
      pos += len + (rng() % 2 ? 0 : rng() % 300);
    }
    std::vector<ckz::ChunkSpan> chunks = ckz::PlanChunks(size, ranges);
    uint64_t at = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const ckz::ChunkSpan& c = chunks[i];
      ASSERT_EQ(c.offset, at);
      ASSERT_GT(c.length, 0u);
      ASSERT_LE(c.length, ckz::kMaxChunk);
      // A chunk is closed early (for a tensor that does not fit) only once it holds the
      // minimum: only the file's last chunk may be smaller.
      if (i + 1 < chunks.size()) {
        ASSERT_GE(c.length, ckz::kMinChunk) << i;
      }
      EXPECT_NO_THROW(ckz::RunsOf(ranges, c.offset, c.length));  // whole elements
      at += c.length;
    }
    ASSERT_EQ(at, size);
  }
}

TEST(CompressLayoutTest, ATensorThatDoesNotFitStartsANewChunk) {
  // 300 KiB of bytes, then a 900 KiB tensor: it starts its own chunk (tensor-aligned).
  std::vector<ckz::TypedRange> ranges = {{300 << 10, 900 << 10, ckz::Transform::kBF16}};
  std::vector<ckz::ChunkSpan> chunks = ckz::PlanChunks(1200 << 10, ranges);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[1].offset, 300u << 10);
}

TEST(CompressArchiveAtomicTest, BoundedOutputIsCutToTheBytesWritten) {
  char tmpl[] = "/tmp/ckpt-ckz-out-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  std::string path = std::string(tmpl) + "/a";
  {
    AtomicOutput out = AtomicOutput::Create(path, 1 << 20);
    out.Write(0, test::B("0123456789"));
    out.Truncate(10);
    out.Commit();
  }
  EXPECT_EQ(Get(path), "0123456789");
  fs::remove_all(tmpl);
}

}  // namespace
}  // namespace ckpt
