// The ledger and the fingerprints it keeps: changes are seen (size, time, content with a
// forged time), copies back with the same content are not changes, the ledger reads back as
// written, a broken one is refused by name, and one process at a time holds a root.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "policy/fingerprint.h"
#include "policy/ledger.h"
#include "test_util.h"

namespace ckpt::policy {
namespace {

namespace fs = std::filesystem;

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-ledger-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  void Write(const std::string& rel, const std::string& content) {
    fs::create_directories((fs::path(root_) / rel).parent_path());
    std::ofstream out(fs::path(root_) / rel, std::ios::binary | std::ios::trunc);
    out << content;
  }

  // Gives rel the modification time of `from` (a forged time).
  void CopyTime(const std::string& rel, const FileState& from) {
    timespec times[2];
    times[0].tv_sec = 0;
    times[0].tv_nsec = UTIME_OMIT;
    times[1].tv_sec = from.mtime_ns / 1000000000;
    times[1].tv_nsec = from.mtime_ns % 1000000000;
    ASSERT_EQ(::utimensat(AT_FDCWD, (fs::path(root_) / rel).c_str(), times, 0), 0);
  }

  std::string root_;
};

TEST_F(LedgerTest, FingerprintOfAFolderLeavesOutputsOut) {
  Write("checkpoint-10/model.bin", "weights");
  Write("checkpoint-10/trainer_state.json", "{}");
  Write("checkpoint-10/bf16/model.bin", "half");
  Fingerprint fp = StatCheckpoint(root_, "checkpoint-10", {"checkpoint-10/bf16"});
  ASSERT_EQ(fp.size(), 2u);
  EXPECT_TRUE(fp.count("checkpoint-10/model.bin"));
  EXPECT_EQ(TotalBytes(fp), 9u);
  HashFiles(root_, fp);
  EXPECT_EQ(fp["checkpoint-10/model.bin"].hash.rfind("ends:", 0), 0u);
  // A single-file checkpoint.
  Write("model_20.pt", "x");
  EXPECT_EQ(StatCheckpoint(root_, "model_20.pt", {}).size(), 1u);
  EXPECT_TRUE(StatCheckpoint(root_, "missing", {}).empty());
}

TEST_F(LedgerTest, TorchFilesAreHashedByTheirPickle) {
  std::string zip = test::ReadFixture("small.pt");
  Write("model_1.pt", zip);
  Fingerprint fp = StatCheckpoint(root_, "model_1.pt", {});
  HashFiles(root_, fp);
  EXPECT_EQ(fp["model_1.pt"].hash.rfind("pickle:", 0), 0u) << fp["model_1.pt"].hash;
}

TEST_F(LedgerTest, ChangesAreSeen) {
  Write("step_1/a.bin", std::string(3 << 20, 'a'));
  Fingerprint recorded = StatCheckpoint(root_, "step_1", {});
  HashFiles(root_, recorded);
  std::string what;
  Fingerprint now = StatCheckpoint(root_, "step_1", {});
  EXPECT_TRUE(SameCheckpoint(root_, now, recorded, &what)) << what;
  EXPECT_TRUE(SameStat(now, recorded));

  // Rewritten with the same size and a forged time: the content hash tells.
  std::string changed(3 << 20, 'a');
  changed[10] = 'b';
  Write("step_1/a.bin", changed);
  CopyTime("step_1/a.bin", recorded["step_1/a.bin"]);
  now = StatCheckpoint(root_, "step_1", {});
  EXPECT_FALSE(SameCheckpoint(root_, now, recorded, &what));
  EXPECT_NE(what.find("rewritten"), std::string::npos) << what;

  // Copied back with the same content and time: not a change (only the inode differs).
  Write("step_1/a.bin.new", std::string(3 << 20, 'a'));
  fs::rename(fs::path(root_) / "step_1/a.bin.new", fs::path(root_) / "step_1/a.bin");
  CopyTime("step_1/a.bin", recorded["step_1/a.bin"]);
  now = StatCheckpoint(root_, "step_1", {});
  EXPECT_FALSE(SameStat(now, recorded));
  EXPECT_TRUE(SameCheckpoint(root_, now, recorded, &what)) << what;

  // A new file, a gone file, a new size.
  Write("step_1/b.bin", "b");
  now = StatCheckpoint(root_, "step_1", {});
  EXPECT_FALSE(SameCheckpoint(root_, now, recorded, &what));
  EXPECT_EQ(what, "step_1/b.bin is new");
  fs::remove(fs::path(root_) / "step_1/b.bin");
  fs::remove(fs::path(root_) / "step_1/a.bin");
  now = StatCheckpoint(root_, "step_1", {});
  EXPECT_FALSE(SameCheckpoint(root_, now, recorded, &what));
  EXPECT_EQ(what, "step_1/a.bin is gone");
  Write("step_1/a.bin", "short");
  now = StatCheckpoint(root_, "step_1", {});
  EXPECT_FALSE(SameCheckpoint(root_, now, recorded, &what));
  EXPECT_EQ(what, "step_1/a.bin changed size");
}

TEST_F(LedgerTest, RoundTripAndAtomicReplace) {
  Write("checkpoint-5/model.bin", "w");
  {
    Ledger l = Ledger::Load(root_);
    EXPECT_TRUE(l.checkpoints().empty());
    CheckpointRecord r;
    r.step = 5;
    r.layout = "hf-trainer";
    r.files = StatCheckpoint(root_, "checkpoint-5", {});
    HashFiles(root_, r.files);
    r.steps["shrink"] = {
        {{"patterns", nlohmann::ordered_json::array()}}, "2025-01-01T00:00:00Z", 10, 8, "note"};
    r.running = StepRecord{nlohmann::ordered_json::object(), "2025-01-01T00:00:01Z", 0, 0, ""};
    r.running_step = "verify";
    r.failed = FailedRecord{"export", nlohmann::ordered_json::object(), "t", "boom"};
    r.outputs = {"checkpoint-5/export"};
    l.checkpoints()["checkpoint-5"] = r;
    l.removed().push_back({"checkpoint-1", 1, 100, "t", "older than the newest kept"});
    l.Save();
  }
  Ledger l = Ledger::Load(root_);
  ASSERT_EQ(l.checkpoints().size(), 1u);
  const CheckpointRecord& r = l.checkpoints()["checkpoint-5"];
  EXPECT_EQ(r.step, 5);
  EXPECT_EQ(r.layout, "hf-trainer");
  EXPECT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.steps.at("shrink").before, 10u);
  EXPECT_EQ(r.steps.at("shrink").after, 8u);
  EXPECT_EQ(r.steps.at("shrink").note, "note");
  ASSERT_TRUE(r.running);
  EXPECT_EQ(r.running_step, "verify");
  ASSERT_TRUE(r.failed);
  EXPECT_EQ(r.failed->error, "boom");
  EXPECT_EQ(r.outputs, std::vector<std::string>{"checkpoint-5/export"});
  ASSERT_EQ(l.removed().size(), 1u);
  EXPECT_EQ(l.removed()[0].bytes, 100u);
  // No temp file is left beside it.
  for (const auto& e : fs::directory_iterator(LedgerDir(root_))) {
    std::string name = e.path().filename().string();
    EXPECT_TRUE(name == "state.json" || name == "lock") << name;
  }
}

TEST_F(LedgerTest, BrokenLedgersAreRefusedByName) {
  fs::create_directories(LedgerDir(root_));
  std::string path = (fs::path(LedgerDir(root_)) / "state.json").string();
  for (const std::string& text :
       {std::string("{not json"), std::string("{\"format\": \"other\"}"),
        std::string("{\"format\": \"ckptool-ledger\", \"version\": 9, \"checkpoints\": {}}"),
        std::string("{\"format\": \"ckptool-ledger\", \"version\": 1, \"checkpoints\": {\"a\": "
                    "{\"step\": \"x\"}}}")}) {
    {
      std::ofstream out(path, std::ios::trunc);
      out << text;
    }
    std::string error = test::ErrorOf([&] { Ledger::Load(root_); });
    EXPECT_EQ(error.rfind(path + ": ", 0), 0u) << text << " -> " << error;
    EXPECT_NE(error.find("move it away"), std::string::npos) << error;
  }
}

TEST_F(LedgerTest, OneProcessPerRoot) {
  RootLock first(root_);
  std::string error = test::ErrorOf([&] { RootLock second(root_); });
  EXPECT_NE(error.find("another ckptool apply or watch (pid "), std::string::npos) << error;
}

}  // namespace
}  // namespace ckpt::policy
