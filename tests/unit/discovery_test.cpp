// Discovery decides what holds each checkpoint once, by content: ContainerOf for one path,
// Locate for what a command was given (in the order reports list them).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/discovery.h"
#include "compress/format.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

std::string Archive() {
  return std::string(ckz::kMagic, sizeof ckz::kMagic) + "rest";
}

TEST(Discovery, ContainerOfDecidesByContentNotByName) {
  test::TempDir d;
  EXPECT_EQ(ContainerOf(d.Put("model.pt", test::ReadFixture("small.pt"))), Container::kFile);
  // An archive is known by its magic, whatever its name; a .ckz name without it is a file.
  EXPECT_EQ(ContainerOf(d.Put("weights.bin", Archive())), Container::kArchive);
  EXPECT_EQ(ContainerOf(d.Put("fake.ckz", "not an archive")), Container::kFile);

  fs::create_directories(d.Path("hf"));
  d.Put("hf/model.safetensors", test::ReadFixture("small.safetensors"));
  EXPECT_EQ(ContainerOf(d.Path("hf")), Container::kModelFolder);

  fs::create_directories(d.Path("ds/global_step5"));
  d.Put("ds/latest", "global_step5");
  EXPECT_EQ(ContainerOf(d.Path("ds")), Container::kZero);

  fs::create_directories(d.Path("dcp"));
  d.Put("dcp/.metadata", "x");
  d.Put("dcp/__0_0.distcp", "x");
  EXPECT_EQ(ContainerOf(d.Path("dcp")), Container::kDcp);

  // A FIFO is never opened (it could block): a file that is no archive.
  ASSERT_EQ(::mkfifo(d.Path("pipe").c_str(), 0600), 0);
  EXPECT_EQ(ContainerOf(d.Path("pipe")), Container::kFile);

  EXPECT_NE(test::ErrorOf([&] { ContainerOf(d.Path("missing")); }).find("no such file"),
            std::string::npos);
}

TEST(Discovery, LocateListsArchivesFilesZeroThenDcpAndWalksFolders) {
  test::TempDir d;
  fs::create_directories(d.Path("run/ds/global_step5"));
  d.Put("run/ds/latest", "global_step5");
  std::string rank =
      d.Put("run/ds/global_step5/mp_rank_00_model_states.pt", test::ReadFixture("small.pt"));
  fs::create_directories(d.Path("run/dcp"));
  d.Put("run/dcp/.metadata", "x");
  d.Put("run/dcp/__0_0.distcp", "x");
  std::string archive = d.Put("a.ckz", Archive());
  std::string file = d.Put("b.pt", test::ReadFixture("small.pt"));

  std::vector<std::string> skipped;
  std::vector<Located> got = Locate({d.Path("run/dcp"), file, d.Path("run/ds"), archive}, &skipped);
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0].kind, Container::kArchive);
  EXPECT_EQ(got[0].path, archive);
  EXPECT_EQ(got[1].kind, Container::kFile);
  EXPECT_EQ(got[1].path, file);
  EXPECT_EQ(got[2].kind, Container::kFile);  // the ZeRO folder's rank file, walked
  EXPECT_EQ(got[2].path, rank);
  EXPECT_EQ(got[3].kind, Container::kZero);
  EXPECT_EQ(got[3].path, d.Path("run/ds"));
  EXPECT_EQ(got[4].kind, Container::kDcp);
  EXPECT_EQ(got[4].path, d.Path("run/dcp"));
  // The .distcp and .metadata files are the DCP folder's, never files of their own.
  for (const Located& l : got) EXPECT_EQ(l.path.find(".distcp"), std::string::npos);
}

}  // namespace
}  // namespace ckpt
