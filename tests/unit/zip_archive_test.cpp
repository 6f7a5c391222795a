#include "zip/zip_archive.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace ckpt::zip {
namespace {

using test::B;
using test::BuildZip;

std::string ErrorOf(const std::string& bytes) {
  return test::ErrorOf([&] { Archive::Parse(B(bytes)); });
}

TEST(ZipArchive, ReadsStoredAndDeflatedRecords) {
  std::string big(100000, 'x');
  for (size_t i = 0; i < big.size(); i += 7) big[i] = static_cast<char>(i);
  std::string z =
      BuildZip({{"a/data.pkl", "hello"}, {"a/data/0", big, true}, {"a/version", "3\n"}});
  Archive a = Archive::Parse(B(z));
  ASSERT_EQ(a.entries().size(), 3u);
  const Entry* e = a.Find("a/data/0");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->method, Method::kDeflate);
  EXPECT_EQ(ReadRecord(B(z), *e, 1 << 20), big);
  EXPECT_EQ(ReadRecord(B(z), *a.Find("a/data.pkl"), 100), "hello");
  EXPECT_EQ(a.Find("a/data/1"), nullptr);
  EXPECT_EQ(a.Find("a/data.pkl")->descriptor_size, 16u);
  // Streaming gives the same bytes in chunks.
  std::string streamed;
  StreamRecord(B(z), *e, [&](Bytes chunk) { streamed.append(AsText(chunk)); });
  EXPECT_EQ(streamed, big);
}

TEST(ZipArchive, PlainEndRecordWithoutZip64) {
  std::string z = BuildZip({{"x/data.pkl", "abc"}}, /*zip64_end=*/false);
  Archive a = Archive::Parse(B(z));
  EXPECT_EQ(a.entries().size(), 1u);
}

TEST(ZipArchive, RecordLimitIsEnforcedBeforeAllocating) {
  std::string z = BuildZip({{"a/data.pkl", std::string(1000, 'p')}});
  EXPECT_THROW(ReadRecord(B(z), *Archive::Parse(B(z)).Find("a/data.pkl"), 999), Error);
}

// What torch's miniz refuses, or reads as an empty folder, is refused with the reason.
TEST(ZipArchive, RejectsWhatTorchCannotRead) {
  const std::string z = BuildZip({{"a/data.pkl", "abc"}, {"a/version", "3\n"}});
  Archive a = Archive::Parse(B(z));
  uint64_t central = a.directory_offset();  // the first record's central directory entry
  auto patched = [&](uint64_t at, uint8_t value) {
    std::string copy = z;
    copy[at] = static_cast<char>(copy[at] | value);
    return copy;
  };
  EXPECT_NE(ErrorOf(patched(central + 8, 0x40)).find("unsupported record flags 0x0848"),
            std::string::npos);
  EXPECT_NE(ErrorOf(patched(central + 34, 0x01)).find("starts on disk 1"), std::string::npos);
  EXPECT_NE(ErrorOf(patched(central + 38, 0x10)).find("'a/data.pkl': record is marked as a folder"),
            std::string::npos);
  // The zip64 locator's disk count must be 1.
  std::string zero_disks = z;
  zero_disks[z.size() - 22 - 20 + 16] = 0;
  EXPECT_NE(ErrorOf(zero_disks).find("multi-disk"), std::string::npos);
}

TEST(ZipArchive, RejectsBadSignaturesAndCounts) {
  std::string z = BuildZip({{"a/data.pkl", "hello"}});
  EXPECT_NE(ErrorOf("PK\x03\x04 not really a zip"), "");
  // Break the central directory signature.
  std::string bad = z;
  size_t cd = bad.find(std::string("PK\x01\x02", 4));
  bad[cd + 2] = 9;
  EXPECT_NE(ErrorOf(bad).find("central directory signature"), std::string::npos) << ErrorOf(bad);
  // Break the local header signature.
  bad = z;
  bad[2] = 9;
  EXPECT_NE(ErrorOf(bad).find("local header signature"), std::string::npos) << ErrorOf(bad);
  // Absurd entry count in the zip64 end record.
  bad = z;
  size_t end64 = bad.find(std::string("PK\x06\x06", 4));
  for (int i = 0; i < 8; ++i) {
    bad[end64 + 24 + i] = '\x7f';
    bad[end64 + 32 + i] = '\x7f';
  }
  EXPECT_NE(ErrorOf(bad).find("entries"), std::string::npos) << ErrorOf(bad);
}

TEST(ZipArchive, RejectsOverlappingAndOutOfFileRecords) {
  std::string z = BuildZip({{"a/data.pkl", "hello"}, {"a/data/0", "world"}});
  // Point the second central entry at the first local header.
  std::string bad = z;
  size_t cd = bad.find(std::string("PK\x01\x02", 4));
  size_t cd2 = bad.find(std::string("PK\x01\x02", 4), cd + 4);
  for (int i = 0; i < 4; ++i) bad[cd2 + 42 + i] = 0;
  std::string err = ErrorOf(bad);
  EXPECT_TRUE(err.find("overlaps") != std::string::npos || err.find("differs") != std::string::npos)
      << err;
  // Claim a compressed size larger than the file.
  bad = z;
  bad[cd + 20] = '\xff';
  bad[cd + 21] = '\xff';
  bad[cd + 24] = '\xff';
  bad[cd + 25] = '\xff';
  EXPECT_NE(ErrorOf(bad).find("runs past"), std::string::npos) << ErrorOf(bad);
}

TEST(ZipArchive, DuplicateNamesAreRejected) {
  std::string z = BuildZip({{"a/data.pkl", "1"}, {"a/data.pkl", "2"}});
  EXPECT_NE(ErrorOf(z).find("duplicate"), std::string::npos);
}

TEST(ZipArchive, CorruptDeflateDataIsAnError) {
  std::string z = BuildZip({{"a/data/0", std::string(5000, 'q'), true}});
  Archive a = Archive::Parse(B(z));
  const Entry* e = a.Find("a/data/0");
  std::string bad = z;
  for (uint64_t i = e->data_offset; i < e->data_end(); ++i) bad[i] = '\xff';
  EXPECT_THROW(ReadRecord(B(bad), *e, 1 << 20), Error);
}

// Every proper prefix of a zip has lost (at least part of) the end-of-central-directory
// record, which is the last thing in the file: each must be refused, and the message must
// say why rather than whatever a later check trips over.
TEST(ZipArchive, TruncationAtEveryByteIsRefusedForItsMissingEndRecord) {
  for (bool zip64_end : {true, false}) {
    std::string z = BuildZip(
        {{"a/data.pkl", "hello"}, {"a/data/0", std::string(300, 'd')}, {"a/version", "3\n"}},
        zip64_end);
    ASSERT_EQ(Archive::Parse(B(z)).entries().size(), 3u);  // the whole file is fine
    for (size_t n = 0; n < z.size(); ++n) {
      std::string err = ErrorOf(z.substr(0, n));
      if (n < 22) {
        EXPECT_EQ(err, fmt::format("not a zip file: only {} bytes", n)) << "cut at " << n;
      } else {
        EXPECT_EQ(err, "not a zip file: no end-of-central-directory record") << "cut at " << n;
      }
    }
  }
}

}  // namespace
}  // namespace ckpt::zip
