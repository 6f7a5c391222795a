// When a checkpoint counts as complete: each framework's marker, files open for writing in
// another process, the settle time (file times, and our own observations in watch), and a
// checkpoint exactly as the ledger recorded it.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "policy/completeness.h"
#include "test_util.h"

namespace ckpt::policy {
namespace {

namespace fs = std::filesystem;

class CompletenessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-complete-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string Write(const std::string& rel, const std::string& content) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out << content;
    return p.string();
  }
  // A real torch file (it must open cleanly).
  std::string Torch(const std::string& rel) { return Write(rel, test::ReadFixture("small.pt")); }

  // Complete? `why` gets the reason when not.
  bool Check(Completeness& c, const std::string& name, std::string* why) {
    c.BeginPass();
    why->clear();
    return c.Complete((fs::path(root_) / name).string(), why);
  }

  Completeness Make(Layout layout = Layout::kAuto, double settle = 0, bool observe = false) {
    Completeness::Options o;
    o.layout = layout;
    o.settle_seconds = settle;
    o.observe = observe;
    return Completeness(root_, o);
  }

  std::string root_;
};

TEST_F(CompletenessTest, DeepSpeedLatestNamesThisTagOrANewerOne) {
  Torch("global_step10/mp_rank_00_model_states.pt");
  Torch("global_step20/mp_rank_00_model_states.pt");
  Completeness c = Make();
  std::string why;
  EXPECT_FALSE(Check(c, "global_step10", &why));
  EXPECT_EQ(why, "DeepSpeed's 'latest' is not written yet");
  Write("latest", "global_step10\n");
  EXPECT_TRUE(Check(c, "global_step10", &why)) << why;
  EXPECT_FALSE(Check(c, "global_step20", &why));
  EXPECT_EQ(why, "DeepSpeed's 'latest' names 'global_step10', not this tag or a newer one");
  EXPECT_EQ(c.LayoutOf("global_step20"), "deepspeed");
  Write("latest", "global_step20");
  EXPECT_TRUE(Check(c, "global_step10", &why)) << why;
  EXPECT_TRUE(Check(c, "global_step20", &why)) << why;
}

TEST_F(CompletenessTest, HfTrainerStateAndMegatronTracker) {
  Torch("checkpoint-5/pytorch_model.bin");
  Torch("iter_0000050/mp_rank_00/model_optim_rng.pt");
  Completeness c = Make();
  std::string why;
  EXPECT_FALSE(Check(c, "checkpoint-5", &why));
  EXPECT_EQ(why, "trainer_state.json is not written yet");
  Write("checkpoint-5/trainer_state.json", "{}");
  EXPECT_TRUE(Check(c, "checkpoint-5", &why)) << why;
  EXPECT_EQ(c.LayoutOf("checkpoint-5"), "hf-trainer");
  EXPECT_FALSE(Check(c, "iter_0000050", &why));
  EXPECT_EQ(why, "latest_checkpointed_iteration.txt is not written yet");
  Write("latest_checkpointed_iteration.txt", "40");
  EXPECT_FALSE(Check(c, "iter_0000050", &why));
  EXPECT_EQ(why, "latest_checkpointed_iteration.txt says '40', not 50 or later");
  Write("latest_checkpointed_iteration.txt", "50\n");
  EXPECT_TRUE(Check(c, "iter_0000050", &why)) << why;
}

TEST_F(CompletenessTest, DcpFolderNeedsItsMetadata) {
  Write("step-7/__0_0.distcp", "PK");
  Completeness c = Make();
  std::string why;
  EXPECT_FALSE(Check(c, "step-7", &why));
  EXPECT_EQ(why, "step-7: .distcp files without .metadata (not written yet)");
  EXPECT_EQ(c.LayoutOf("step-7"), "dcp");
  // A forced layout asks for its marker only (plus the DCP rule for folders).
  Completeness hf = Make(Layout::kHfTrainer);
  EXPECT_FALSE(Check(hf, "step-7", &why));
  EXPECT_EQ(why, "trainer_state.json is not written yet");
}

TEST_F(CompletenessTest, FilesOpenForWritingInAnotherProcess) {
  std::string path = Torch("model_3.pt");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int fd = ::open(path.c_str(), O_WRONLY | O_APPEND);
    char c = fd >= 0 ? 1 : 0;
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  auto writers = FilesOpenForWriting(st.st_dev);
  ASSERT_TRUE(writers.count(st.st_ino));
  EXPECT_EQ(writers[st.st_ino].rfind("pid " + std::to_string(child) + " (", 0), 0u)
      << writers[st.st_ino];
  Completeness comp = Make();
  std::string why;
  EXPECT_FALSE(Check(comp, "model_3.pt", &why));
  EXPECT_EQ(why.rfind("model_3.pt is open for writing by pid " + std::to_string(child), 0), 0u)
      << why;
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_TRUE(Check(comp, "model_3.pt", &why)) << why;
  EXPECT_EQ(comp.LayoutOf("model_3.pt"), "file");
}

TEST_F(CompletenessTest, SettleTimeAndTheLedgersShortcut) {
  Torch("epoch=1-step=10.ckpt");
  Completeness c = Make(Layout::kAuto, 3600);
  std::string why;
  EXPECT_FALSE(Check(c, "epoch=1-step=10.ckpt", &why));
  EXPECT_EQ(why.rfind("settling: nothing changed for ", 0), 0u) << why;
  ASSERT_TRUE(c.NextSettle());
  EXPECT_GT(*c.NextSettle(), 3500);
  EXPECT_EQ(c.LayoutOf("epoch=1-step=10.ckpt"), "lightning");
  // Exactly as the ledger recorded it after its last step: complete without waiting.
  Fingerprint recorded = StatCheckpoint(root_, "epoch=1-step=10.ckpt", {});
  Completeness::Options o;
  o.settle_seconds = 3600;
  o.recorded = [&](const std::string&) { return &recorded; };
  Completeness known(root_, o);
  EXPECT_TRUE(Check(known, "epoch=1-step=10.ckpt", &why)) << why;
  Torch("epoch=1-step=10.ckpt");  // rewritten: the settle time applies again
  EXPECT_FALSE(Check(known, "epoch=1-step=10.ckpt", &why));
}

TEST_F(CompletenessTest, WatchAlsoNeedsItsOwnObservations) {
  std::string path = Torch("model_4.pt");
  timespec old[2] = {{0, UTIME_OMIT}, {::time(nullptr) - 3600, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), old, 0), 0);
  std::string why;
  Completeness once = Make(Layout::kAuto, 0.3, false);
  EXPECT_TRUE(Check(once, "model_4.pt", &why)) << why;  // an hour old
  Completeness watch = Make(Layout::kAuto, 0.3, true);
  EXPECT_FALSE(Check(watch, "model_4.pt", &why));  // first seen just now
  EXPECT_EQ(why.rfind("settling: ", 0), 0u) << why;
  ::usleep(400 * 1000);
  EXPECT_TRUE(Check(watch, "model_4.pt", &why)) << why;
}

TEST_F(CompletenessTest, BrokenFilesAndTempFilesAreNotComplete) {
  Write("model_5.pt", test::ReadFixture("small.pt").substr(0, 100));
  Completeness c = Make();
  std::string why;
  EXPECT_FALSE(Check(c, "model_5.pt", &why));
  EXPECT_FALSE(why.empty());
  Torch("step_6/model.pt");
  Write("step_6/.model.pt.ckptool-tmp-1-0", "x");
  EXPECT_FALSE(Check(c, "step_6", &why));
  EXPECT_EQ(why, "holds a temp file .model.pt.ckptool-tmp-1-0");
}

}  // namespace
}  // namespace ckpt::policy
