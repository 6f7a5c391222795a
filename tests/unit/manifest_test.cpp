// SHA-256 (io/sha256.h) against the FIPS 180-2 vectors, and manifests (checkpoint/manifest.h) of a
// file and of a folder: written, checked, and every kind of difference named.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/manifest.h"
#include "io/sha256.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string Hex(std::string_view text) {
  Sha256 h;
  h.Update(AsBytes(text));
  return h.HexDigest();
}

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // A million 'a's, fed in uneven pieces, and the same through a file read in 1 MiB blocks.
  std::string million(1000000, 'a');
  Sha256 h;
  for (size_t at = 0; at < million.size();) {
    size_t n = std::min<size_t>(million.size() - at, 1 + at % 7919);
    h.Update(AsBytes(std::string_view(million).substr(at, n)));
    at += n;
  }
  const std::string want = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  EXPECT_EQ(h.HexDigest(), want);
  test::TempDir d;
  EXPECT_EQ(Sha256OfFile(d.Put("a.bin", million)), want);
  EXPECT_THROW(Sha256OfFile(d.Path("missing")), Error);
}

TEST(Manifest, FileAndFolderRoundTripAndEveryDifferenceIsNamed) {
  test::TempDir d;
  const std::string file = d.Put("model.pt", test::ReadFixture("small.pt"));
  EXPECT_FALSE(HasManifest(file));
  ManifestOptions o;
  ManifestResult r = WriteManifest(file, o);
  EXPECT_EQ(r.manifest, file + kManifestSuffix);
  EXPECT_EQ(r.files, 1u);
  EXPECT_GT(r.tensors, 0u);
  EXPECT_TRUE(HasManifest(file));
  EXPECT_TRUE(CheckManifest(file, 1).empty());
  EXPECT_THROW(WriteManifest(file, o), Error);  // exists: --force only

  fs::create_directories(d.Path("hf/sub"));
  d.Put("hf/model.safetensors", test::ReadFixture("small.safetensors"));
  d.Put("hf/config.json", "{}");
  d.Put("hf/sub/notes.txt", "x");
  fs::create_symlink("model.safetensors", d.Path("hf/last.safetensors"));
  const std::string folder = d.Path("hf");
  r = WriteManifest(folder, o);
  EXPECT_EQ(r.files, 3u);
  EXPECT_TRUE(CheckManifest(folder, 2).empty());
  std::vector<std::string> at = ManifestedAt(d.path());
  EXPECT_EQ(at, (std::vector<std::string>{folder, file}));

  d.Put("hf/config.json", "{ }");                                    // changed size
  d.Put("hf/sub/notes.txt", "y");                                    // same size, other bytes
  d.Put("hf/extra.bin", "new");                                      // added
  fs::remove(d.Path("hf/last.safetensors"));                         // a link gone
  fs::create_symlink("config.json", d.Path("hf/last.safetensors"));  // ... pointing elsewhere
  std::vector<torch::Problem> p = CheckManifest(folder, 2);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].where, "config.json");
  EXPECT_NE(p[0].what.find("bytes where"), std::string::npos);
  EXPECT_EQ(p[1].where, "extra.bin");
  EXPECT_NE(p[1].what.find("not in"), std::string::npos);
  EXPECT_EQ(p[2].where, "last.safetensors");
  EXPECT_NE(p[2].what.find("links to config.json"), std::string::npos);
  EXPECT_EQ(p[3].where, "sub/notes.txt");
  EXPECT_NE(p[3].what.find("SHA-256 differs"), std::string::npos);
  // Structure only: sizes and presence, the changed bytes of the same size unseen.
  EXPECT_EQ(CheckManifest(folder, 2, nullptr, false).size(), 3u);

  fs::remove(file);
  p = CheckManifest(file, 1);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_NE(p[0].what.find("missing"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
