// AtomicOutput: what it replaces (symlink targets, only writable files), and that it never
// replaces anything when an input changed, a write failed or the output was abandoned.
#include "io/atomic_output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "io/checked_ranges.h"
#include "io/mapped_file.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;

class AtomicOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-atomic-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  static void Put(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  static std::string Get(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<std::string> Listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
  static void WriteAndCommit(const std::string& path, const std::string& text) {
    AtomicOutput out = AtomicOutput::Create(path, text.size());
    out.Write(0, Bytes(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
    out.Commit();
  }

  std::string dir_;
};

TEST_F(AtomicOutputTest, ReplacesOnlyAtCommit) {
  Put(Path("a.pt"), "old");
  {
    AtomicOutput out = AtomicOutput::Create(Path("a.pt"), 3);
    out.Write(0, Bytes(reinterpret_cast<const uint8_t*>("new"), 3));
    EXPECT_EQ(Get(Path("a.pt")), "old");
    EXPECT_EQ(Listing().size(), 2u);  // the original and the hidden temp file
    out.Commit();
  }
  EXPECT_EQ(Get(Path("a.pt")), "new");
  EXPECT_EQ(Listing(), std::vector<std::string>{"a.pt"});
}

TEST_F(AtomicOutputTest, StagedWritesLandAtFlushAndNeverFillHoles) {
  auto b = [](const char* text) {
    return Bytes(reinterpret_cast<const uint8_t*>(text), std::strlen(text));
  };
  AtomicOutput out = AtomicOutput::Create(Path("s.bin"), 16);
  out.Write(0, b("................"));
  {
    AtomicOutput::Staged staged(out, 2, 10);  // [2, 12)
    out.Write(2, b("ab"));
    out.Write(4, b("cd"));   // joins the run [2, 6)
    out.Write(9, b("xyz"));  // a second run [9, 12)
    out.Write(12, b("Z"));   // outside: straight to the file
    EXPECT_EQ(Get(out.temp_path()), "............Z...");
    // Another thread writes into the hole [6, 9) meanwhile: it goes straight to the file,
    // and the flush must leave it alone.
    std::thread([&] { out.Write(6, b("HHH")); }).join();
    staged.Flush();
    out.Write(0, b("<"));  // after Flush: straight to the file again
  }
  EXPECT_EQ(Get(out.temp_path()), "<.abcdHHHxyzZ...");
  {
    AtomicOutput::Staged dropped(out, 0, 16);
    out.Write(0, b("dropped"));
  }  // no Flush: an abandoned output's bytes are not written
  EXPECT_EQ(Get(out.temp_path()), "<.abcdHHHxyzZ...");
  // CopyFrom inside a staged range reads the input into the buffer.
  Put(Path("in.bin"), "0123456789");
  MappedFile in = MappedFile::Open(Path("in.bin"));
  {
    AtomicOutput::Staged staged(out, 12, 4);
    out.CopyFrom(in, 3, 12, 4);
    EXPECT_EQ(Get(out.temp_path()).substr(12), "Z...");
    staged.Flush();
  }
  EXPECT_EQ(Get(out.temp_path()), "<.abcdHHHxyz3456");
}

TEST_F(AtomicOutputTest, CheckedWritesReadBackWhatReachesTheFileAndKnowWhatDidNot) {
  auto b = [](const char* text) {
    return Bytes(reinterpret_cast<const uint8_t*>(text), std::strlen(text));
  };
  Put(Path("in.bin"), "0123456789");
  MappedFile in = MappedFile::Open(Path("in.bin"));
  AtomicOutput out = AtomicOutput::Create(Path("c.bin"), 16);
  AtomicOutput other = AtomicOutput::Create(Path("o.bin"), 16);
  {
    AtomicOutput::CheckedWrites scope(out);
    out.Write(0, b("abcd"));
    other.CopyFrom(in, 0, 0, 4);  // another output's kernel copy does not count
    EXPECT_TRUE(scope.all_checked());
    {
      AtomicOutput::CheckedWrites inner(other);  // a scope of another output, nested
      out.Write(4, b("ef"));
      EXPECT_TRUE(scope.all_checked());
      {
        AtomicOutput::Staged staged(out, 8, 4);
        out.Write(8, b("wxyz"));  // collected in memory: not read back at once
        staged.Flush();
      }
      EXPECT_TRUE(inner.all_checked());
    }
    EXPECT_FALSE(scope.all_checked());
  }
  {
    AtomicOutput::CheckedWrites scope(out);
    out.CopyFrom(in, 2, 12, 4);  // the kernel copies: never in memory, not checked
    EXPECT_FALSE(scope.all_checked());
  }
  {
    AtomicOutput::CheckedWrites scope(out);
    out.CopyFrom(in, 2, 12, 0);  // nothing copied
    EXPECT_TRUE(scope.all_checked());
  }
  EXPECT_EQ(Get(out.temp_path()), std::string("abcdef\0\0wxyz2345", 16));
  // What is checked is what the file holds: bytes changed behind the writer's back fail,
  // naming the range of the chunk that differs.
  out.CheckWritten(0, b("abcdef"));
  {
    std::fstream f(out.temp_path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f << 'D';
  }
  EXPECT_EQ(test::ErrorOf([&] { out.CheckWritten(0, b("abcdef")); }),
            out.temp_path() +
                ": bytes 0..6 of the new file read back differently than they "
                "were written");
  // A file cut short reads as one.
  ASSERT_EQ(::truncate(out.temp_path().c_str(), 8), 0);
  Bytes tail(reinterpret_cast<const uint8_t*>("\0\0wxyz"), 6);
  EXPECT_NE(test::ErrorOf([&] { out.CheckWritten(6, tail); }).find("truncated"), std::string::npos);
}

TEST_F(AtomicOutputTest, CheckedRangesKnowWhichRangesWereReadBackWhole) {
  // Four ranges of 64 bytes, each written in 4 pieces on 3 threads: range 0 all through
  // memory, range 1 with one piece the kernel copies, range 2 never written, range 3 with a
  // piece collected by a Staged run.
  Put(Path("in.bin"), std::string(64, 'k'));
  MappedFile in = MappedFile::Open(Path("in.bin"));
  AtomicOutput out = AtomicOutput::Create(Path("r.bin"), 256);
  CheckedRanges checked(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int piece = t; piece < 4; piece += 3) {
        for (size_t range : {0, 1, 3}) {
          uint64_t at = 64 * range + 16 * piece;
          int got = checked.Write(out, range, [&] {
            if (range == 1 && piece == 2) {
              out.CopyFrom(in, 0, at, 16);
            } else if (range == 3 && piece == 1) {
              AtomicOutput::Staged staged(out, at, 16);
              out.Write(at, Bytes(reinterpret_cast<const uint8_t*>("ssssssssssssssss"), 16));
              staged.Flush();
            } else {
              out.Write(at, Bytes(reinterpret_cast<const uint8_t*>("wwwwwwwwwwwwwwww"), 16));
            }
            return piece;
          });
          EXPECT_EQ(got, piece);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(checked.checked(0));
  EXPECT_FALSE(checked.checked(1));
  EXPECT_FALSE(checked.checked(2));
  EXPECT_FALSE(checked.checked(3));
  std::string file = Get(out.temp_path());
  EXPECT_EQ(file.substr(0, 64), std::string(64, 'w'));
  EXPECT_EQ(file.substr(64, 64),
            std::string(32, 'w') + std::string(16, 'k') + std::string(16, 'w'));
  EXPECT_EQ(file.substr(192, 64),
            std::string(16, 'w') + std::string(16, 's') + std::string(32, 'w'));
}

TEST_F(AtomicOutputTest, AbandonedOutputLeavesNothingBehind) {
  Put(Path("a.pt"), "old");
  { AtomicOutput out = AtomicOutput::Create(Path("a.pt"), 100); }
  EXPECT_EQ(Get(Path("a.pt")), "old");
  EXPECT_EQ(Listing(), std::vector<std::string>{"a.pt"});
}

TEST_F(AtomicOutputTest, ChangedInputIsNeverReplaced) {
  Put(Path("a.pt"), "original");
  MappedFile in = MappedFile::Open(Path("a.pt"));
  AtomicOutput out = AtomicOutput::Create(Path("a.pt"), 3);
  out.RequireUnchanged(in);
  out.Write(0, Bytes(reinterpret_cast<const uint8_t*>("new"), 3));
  std::ofstream(Path("a.pt"), std::ios::app) << "+appended by another process";
  std::string error = test::ErrorOf([&] { out.Commit(); });
  EXPECT_EQ(error,
            Path("a.pt") + ": the file changed while it was being processed; nothing was replaced");
  EXPECT_EQ(Get(Path("a.pt")), "original+appended by another process");
}

TEST_F(AtomicOutputTest, TouchedOrReplacedInputsCountAsChanged) {
  Put(Path("src.pt"), "data");
  for (int way = 0; way < 3; ++way) {
    MappedFile in = MappedFile::Open(Path("src.pt"));
    AtomicOutput out = AtomicOutput::Create(Path("out.safetensors"), 1);
    out.RequireUnchanged(in);
    if (way == 0) {
      struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};  // same bytes, new mtime
      ASSERT_EQ(::utimensat(AT_FDCWD, Path("src.pt").c_str(), times, 0), 0);
    } else if (way == 1) {
      Put(Path("other"), "data");  // same bytes, another inode
      fs::rename(Path("other"), Path("src.pt"));
    } else {
      fs::remove(Path("src.pt"));
    }
    std::string error = test::ErrorOf([&] { out.Commit(); });
    EXPECT_NE(error.find("the file changed while it was being processed; " +
                         Path("out.safetensors") + " was not written"),
              std::string::npos)
        << way << ": " << error;
    EXPECT_FALSE(fs::exists(Path("out.safetensors")));
    Put(Path("src.pt"), "data");
  }
}

TEST_F(AtomicOutputTest, SymlinkKeepsPointingAtTheReplacedFile) {
  fs::create_directory(Path("epoch3"));
  Put(Path("epoch3/model.ckpt"), "big");
  fs::create_symlink("epoch3/model.ckpt", Path("last.ckpt"));
  AtomicOutput out = AtomicOutput::Create(Path("last.ckpt"), 5);
  EXPECT_EQ(out.final_path(), fs::canonical(Path("epoch3/model.ckpt")).string());
  out.Write(0, Bytes(reinterpret_cast<const uint8_t*>("small"), 5));
  out.Commit();
  EXPECT_TRUE(fs::is_symlink(Path("last.ckpt")));
  EXPECT_EQ(Get(Path("epoch3/model.ckpt")), "small");
  EXPECT_EQ(Get(Path("last.ckpt")), "small");
  EXPECT_EQ(Listing(), (std::vector<std::string>{"epoch3", "last.ckpt"}));
}

TEST_F(AtomicOutputTest, RefusesWhatIsNotARegularFile) {
  fs::create_directory(Path("folder"));
  EXPECT_NE(test::ErrorOf([&] { WriteAndCommit(Path("folder"), "x"); }).find("not a regular file"),
            std::string::npos);
  fs::create_symlink("missing.pt", Path("dangling.pt"));
  EXPECT_NE(test::ErrorOf([&] {
              WriteAndCommit(Path("dangling.pt"), "x");
            }).find("cannot follow the symlink"),
            std::string::npos);
}

// Permission bits bind only a process without CAP_DAC_OVERRIDE (root usually has it); the
// integration tests drop it to check the same refusals through the CLI.
TEST_F(AtomicOutputTest, ReadOnlyFileAndFolderAreRefusedWhenPermissionsApply) {
  Put(Path("ro.pt"), "old");
  ::chmod(Path("ro.pt").c_str(), 0444);
  if (::access(Path("ro.pt").c_str(), W_OK) == 0) {
    if (std::getenv("CKPT_REQUIRE_PERMISSIONS") != nullptr)
      FAIL() << "tests/unprivileged did not drop privileges";
    GTEST_SKIP() << "this process bypasses permission bits";
  }
  std::string error = test::ErrorOf([&] { WriteAndCommit(Path("ro.pt"), "new"); });
  EXPECT_EQ(error, Path("ro.pt") +
                       ": no permission to replace it (Permission denied); nothing was replaced");
  EXPECT_EQ(Get(Path("ro.pt")), "old");
  ::chmod(dir_.c_str(), 0555);
  error = test::ErrorOf([&] { WriteAndCommit(Path("new.pt"), "new"); });
  ::chmod(dir_.c_str(), 0755);
  EXPECT_NE(error.find("cannot create a file in " + dir_ + ": Permission denied"),
            std::string::npos)
      << error;
  EXPECT_EQ(Listing(), std::vector<std::string>{"ro.pt"});
}

TEST_F(AtomicOutputTest, NotEnoughSpaceFailsBeforeCreatingAnything) {
  std::string error =
      test::ErrorOf([&] { AtomicOutput::Create(Path("huge.pt"), uint64_t{1} << 62); });
  EXPECT_NE(error.find("the output needs 4096.00 PiB but only"), std::string::npos) << error;
  EXPECT_TRUE(Listing().empty());
}

}  // namespace
}  // namespace ckpt
