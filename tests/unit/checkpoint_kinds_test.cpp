// The Checkpoint interface (checkpoint/checkpoint.h): every kind of container opens to the
// implementation of its kind, and inspect --json lists each under its section, in order.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/opened_checkpoint.h"
#include "test_util.h"

namespace ckpt {
namespace {

TEST(CheckpointKinds, EveryKindOpensToItsOwnImplementation) {
  for (Container k : {Container::kFile, Container::kArchive, Container::kZero, Container::kDcp}) {
    std::unique_ptr<Checkpoint> c = CheckpointAt({k, "nowhere", nullptr});  // nothing read yet
    ASSERT_NE(c, nullptr);
    EXPECT_EQ(c->kind(), k);
    EXPECT_EQ(c->path(), "nowhere");
    EXPECT_EQ(c->name(), "nowhere");
  }
  // A model folder is described and verified by its files.
  EXPECT_EQ(CheckpointAt({Container::kModelFolder, "hf", nullptr})->kind(), Container::kFile);
}

TEST(CheckpointKinds, ReportSectionsListFilesFirstAndEachKindOnce) {
  std::vector<std::string> keys;
  for (const ReportSection* s : ReportSections()) keys.emplace_back(s->key);
  EXPECT_EQ(keys, (std::vector<std::string>{"files", "archives", "zero", "dcp"}));
  EXPECT_TRUE(SectionOf(Container::kFile).always);
  EXPECT_FALSE(SectionOf(Container::kZero).always);
  EXPECT_EQ(SectionOf(Container::kDcp).path_key, "folder");
  EXPECT_EQ(SectionOf(Container::kArchive).path_key, "path");
  EXPECT_EQ(&SectionOf(Container::kModelFolder), &SectionOf(Container::kFile));
}

TEST(CheckpointKinds, AMissingCheckpointFailsWhenItIsReadNamingItsPath) {
  test::TempDir d;
  const std::string gone = d.Path("gone.pt");
  for (Container k : {Container::kFile, Container::kArchive, Container::kZero, Container::kDcp}) {
    std::unique_ptr<Checkpoint> c = CheckpointAt({k, gone, nullptr});
    try {
      c->Verify(1, {}, true);
      ADD_FAILURE() << "verified a checkpoint that is not there";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("gone.pt"), std::string::npos) << e.what();
    }
  }
}

TEST(CheckpointKinds, AFileDescribesItselfUnderItsNameAndVerifiesClean) {
  test::TempDir d;
  std::unique_ptr<Checkpoint> c =
      CheckpointAt({Container::kFile, d.Put("small.pt", test::ReadFixture("small.pt")), nullptr});
  c->set_name("archive.ckz: small.pt");
  std::vector<std::string> texts;
  c->DescribeText({}, [&](const std::string& t) { texts.push_back(t); });
  ASSERT_EQ(texts.size(), 1u);
  EXPECT_NE(texts[0].find("archive.ckz: small.pt"), std::string::npos);
  VerifyOutcome v = c->Verify(1, {}, true);
  EXPECT_TRUE(v.problems.empty());
  EXPECT_NE(v.ok.find(": OK ("), std::string::npos) << v.ok;
  // Its logical model: the tensors the file means.
  std::unique_ptr<OpenedCheckpoint> m = c->OpenModel({});
  EXPECT_FALSE(m->model().tensors.empty());
  EXPECT_EQ(m->path(), c->path());
}

}  // namespace
}  // namespace ckpt
