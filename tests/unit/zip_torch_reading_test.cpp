// The zip reader reads what torch's miniz reads (third_party/miniz-3.0.2/miniz.c): names
// looked up ignoring A-Z case, the last end-of-central-directory signature in miniz's search
// windows; and it refuses a file where another reading is possible (names that fold alike, a
// second end record that leads to another directory, a local header naming another record).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

#include "base/error.h"
#include "test_util.h"
#include "torch/torch_file.h"
#include "zip/zip_archive.h"

namespace ckpt::zip {
namespace {

using test::B;
using test::BuildZip;

std::string ErrorOf(const std::string& bytes) {
  return test::ErrorOf([&] { Archive::Parse(B(bytes)); });
}

bool Has(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

std::string EndRecord(uint16_t count, uint32_t cd_size, uint32_t cd_offset, uint16_t comment) {
  std::string out;
  AppendLE<uint32_t>(out, 0x06054b50);
  AppendLE<uint16_t>(out, 0);
  AppendLE<uint16_t>(out, 0);
  AppendLE<uint16_t>(out, count);
  AppendLE<uint16_t>(out, count);
  AppendLE<uint32_t>(out, cd_size);
  AppendLE<uint32_t>(out, cd_offset);
  AppendLE<uint16_t>(out, comment);
  return out;
}

// A plain-end-record zip of two records and where its directory is.
struct Plain {
  std::string bytes;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t first_entry_size = 0;  // the central entry of a/data.pkl
};

Plain TwoRecords() {
  Plain p;
  p.bytes = BuildZip({{"a/data.pkl", "pickle"}, {"a/version", "3\n"}}, /*zip64_end=*/false);
  Archive a = Archive::Parse(B(p.bytes));
  p.cd_offset = a.directory_offset();
  p.cd_size = a.directory_size();
  p.first_entry_size = 46 + std::string("a/data.pkl").size();
  return p;
}

TEST(ZipTorchReading, NamesThatDifferOnlyInCaseAreRefused) {
  for (auto [first, second] :
       {std::pair<std::string, std::string>{"archive/DATA.PKL", "archive/data.pkl"},
        {"archive/data/0", "archive/Data/0"},
        {"archive/Data/0", "archive/DATA/0"}}) {
    std::string err = ErrorOf(BuildZip({{first, "1"}, {"archive/version", "3\n"}, {second, "2"}}));
    EXPECT_TRUE(
        Has(err, fmt::format("records '{}' and '{}' differ only in letter case", first, second)))
        << err;
  }
  // Exact duplicates keep their own message; bytes outside A-Z are not folded.
  EXPECT_TRUE(Has(ErrorOf(BuildZip({{"a/x", "1"}, {"a/x", "2"}})), "duplicate record name 'a/x'"));
  EXPECT_EQ(Archive::Parse(
                B(BuildZip({{"a/\xc3\x89", "1"}, {"a/\xc3\xa9", "2"}, {"a/[", "3"}, {"a/{", "4"}})))
                .entries()
                .size(),
            4u);
}

TEST(ZipTorchReading, FindIgnoresCaseAsMinizDoes) {
  std::string z =
      BuildZip({{"Model/Data.pkl", "p"}, {"Model/data/0", "d"}, {"model/VERSION", "3"}});
  Archive a = Archive::Parse(B(z));
  ASSERT_NE(a.Find("model/data.pkl"), nullptr);
  EXPECT_EQ(a.Find("MODEL/DATA.PKL")->name, "Model/Data.pkl");
  EXPECT_EQ(a.Find("Model/DATA/0")->name, "Model/data/0");
  EXPECT_EQ(a.Find("Model/version")->name, "model/VERSION");
  EXPECT_EQ(a.Find("Model/version2"), nullptr);
  EXPECT_EQ(a.Find("Model/data"), nullptr);
}

TEST(ZipTorchReading, LocalHeaderNamingAnotherRecordIsRefused) {
  std::string z = BuildZip({{"a/data.pkl", "pickle"}, {"a/version", "3\n"}});
  std::string bad = z;
  bad[30 + 2] = 'D';  // the local header of a/data.pkl now names a/Data.pkl
  EXPECT_TRUE(Has(ErrorOf(bad),
                  "local header at offset 0 names 'a/Data.pkl', which differs from the central "
                  "directory's 'a/data.pkl'"))
      << ErrorOf(bad);
}

TEST(ZipTorchReading, WhatMinizRefusesInADirectoryIsRefused) {
  std::string nul = ErrorOf(BuildZip({{std::string("a/data.pkl\0x", 12), "p"}}));
  EXPECT_TRUE(Has(nul, "record 'a/data.pkl\\0...' has a NUL byte in its name")) << nul;
  // A deflated record declaring 3 bytes from 0 compressed ones.
  std::string z = BuildZip({{"a/data.pkl", "abc", true}});
  size_t cd = z.find(std::string("PK\x01\x02", 4));
  for (int i = 0; i < 4; ++i) z[cd + 20 + i] = 0;
  EXPECT_TRUE(Has(ErrorOf(z), "declares 3 bytes but no compressed data")) << ErrorOf(z);
}

// miniz takes the last end-record signature with 22 bytes after it, whatever its comment says.
// A reader that wants the comment to reach the end of the file takes end record 1 here.
TEST(ZipTorchReading, SecondEndRecordLeadingToAnotherDirectoryIsRefused) {
  Plain p = TwoRecords();
  uint64_t eocd = p.bytes.size() - 22;
  std::string cd2 = p.bytes.substr(p.cd_offset, p.first_entry_size);  // lists a/data.pkl only
  std::string body = p.bytes.substr(0, eocd) + cd2;
  std::string end2 =
      EndRecord(1, static_cast<uint32_t>(cd2.size()), static_cast<uint32_t>(eocd), 0);
  for (std::string tail : {std::string("\0\0", 2), std::string()}) {
    std::string f =
        body +
        EndRecord(2, static_cast<uint32_t>(p.cd_size), static_cast<uint32_t>(p.cd_offset),
                  static_cast<uint16_t>(end2.size() + tail.size())) +
        end2 + tail;
    std::string err = ErrorOf(f);
    EXPECT_TRUE(Has(err, fmt::format("torch's zip reader (miniz) takes the last one, at offset {} "
                                     "(1 record at offset {}); the one at offset {} (2 records "
                                     "at offset {}) is another reading",
                                     body.size() + 22, eocd, body.size(), p.cd_offset)))
        << err;
  }
  // The last record read alone (what miniz reads) is a good archive of one record.
  std::string alone = body + end2;
  EXPECT_EQ(Archive::Parse(B(alone)).entries().size(), 1u);
}

TEST(ZipTorchReading, LastEndRecordWithBytesAfterItsCommentIsRefused) {
  Plain p = TwoRecords();
  std::string err = ErrorOf(p.bytes + "xy");
  EXPECT_TRUE(Has(err, "has a 0-byte comment but 2 bytes follow it")) << err;
  std::string short_comment = p.bytes;
  short_comment[short_comment.size() - 2] = 5;  // claims 5 bytes of comment, none there
  err = ErrorOf(short_comment);
  EXPECT_TRUE(Has(err, "has a 5-byte comment but 0 bytes follow it")) << err;
  // A comment that reaches the end is fine, even one holding the signature's bytes.
  std::string commented = p.bytes;
  std::string comment = std::string("PK\x05\x06", 4) + std::string(30, 'c');
  commented[commented.size() - 2] = static_cast<char>(comment.size());
  // miniz takes the one inside the comment.
  EXPECT_TRUE(Has(
      ErrorOf(commented + comment),
      fmt::format("(the last signature, at offset {}, whose 25443-byte comment", p.bytes.size())))
      << ErrorOf(commented + comment);
  comment = "a comment";
  commented[commented.size() - 2] = static_cast<char>(comment.size());
  EXPECT_EQ(Archive::Parse(B(commented + comment)).entries().size(), 2u);
}

// Tensor bytes can hold the signature by chance: only a record that leads to another
// directory that parses counts.
TEST(ZipTorchReading, SignatureBytesInRecordDataAreNoAlarm) {
  Plain p = TwoRecords();
  std::string sig("PK\x05\x06", 4);
  std::string random_fields = sig + std::string(
                                        "\x01\x02\x03\x04\x05\x06\x07\x08\x09\x10\x11\x12"
                                        "\x13\x14\x15\x16\x17\x18",
                                        18);
  std::string zeros = sig + std::string(18, '\0');         // an empty directory at offset 0
  std::string copy = p.bytes.substr(p.bytes.size() - 22);  // the real end record itself
  std::string fake_dir =
      sig + EndRecord(1, 46, 0, 0).substr(4);  // one entry at offset 0: a local header there
  for (const std::string& data : {random_fields, zeros, copy, fake_dir, sig + sig + sig}) {
    std::string z = BuildZip({{"a/data.pkl", "pickle"}, {"a/data/0", data + data}}, false);
    EXPECT_EQ(Archive::Parse(B(z)).entries().size(), 2u) << ErrorOf(z);
    z = BuildZip({{"a/data.pkl", "pickle"}, {"a/data/0", data}});
    EXPECT_EQ(Archive::Parse(B(z)).entries().size(), 2u) << ErrorOf(z);
  }
}

// Each end record that leads into a long directory which breaks only at its end costs a
// walk: the work is bounded, and a file that needs more is refused.
TEST(ZipTorchReading, EndRecordsLeadingIntoLongDirectoriesAreBounded) {
  constexpr uint32_t kChain = 30000;  // minimal central entries in record data
  std::string chain;
  for (uint32_t i = 0; i < kChain; ++i) {
    AppendLE<uint32_t>(chain, 0x02014b50);
    chain += std::string(42, '\0');
  }
  auto build = [&](const std::string& fakes) {
    return BuildZip({{"a/data.pkl", "pickle"}, {"a/data/0", chain}, {"a/data/1", fakes}}, false);
  };
  const size_t kFakes = 40;
  uint64_t chain_at =
      Archive::Parse(B(build(std::string(22 * kFakes, 'x')))).Find("a/data/0")->data_offset;
  std::string fakes;
  for (size_t i = 0; i < kFakes; ++i) {
    fakes += EndRecord(kChain + 1, (kChain + 1) * 46, static_cast<uint32_t>(chain_at), 0);
  }
  std::string err = ErrorOf(build(fakes));
  EXPECT_TRUE(Has(err, "lead into central directories too often for ckptool to check")) << err;
  // A few are checked and found harmless.
  std::string few = fakes.substr(0, 22 * 3) + std::string(22 * (kFakes - 3), 'x');
  EXPECT_EQ(Archive::Parse(B(build(few))).entries().size(), 3u) << ErrorOf(build(few));
}

// mz_zip_reader_locate_header_sig reads 4096-byte windows back from the end, stepping 4093
// bytes, and stops after the window starting 65557 bytes or more before the end; the step
// is computed unsigned, so from a window starting below offset 4093 it reads at a wrapped
// offset and fails.
TEST(ZipTorchReading, EndRecordIsLookedForWhereMinizLooks) {
  Plain p = TwoRecords();
  auto with_comment = [&](size_t n) {
    std::string z = p.bytes;
    z[z.size() - 2] = static_cast<char>(n & 0xFF);
    z[z.size() - 1] = static_cast<char>(n >> 8);
    return z + std::string(n, 'c');
  };
  // Up to 4074 bytes of comment: the record is in the last window.
  EXPECT_EQ(Archive::Parse(B(with_comment(4074))).entries().size(), 2u);
  // Further back in a file under 69584 bytes, a window starts below 4093 before it reaches the
  // record: miniz finds none (torch.load fails), whatever Python's zipfile finds.
  for (size_t n : {4075u, 4500u, 40000u, 65535u}) {
    std::string z = with_comment(n);
    std::string err = ErrorOf(z);
    EXPECT_TRUE(Has(err, fmt::format("its end-of-central-directory record (at offset {}) is not "
                                     "in the bytes torch's zip reader (miniz) searches",
                                     z.size() - 22 - n)))
        << n << ": " << err;
  }
  // In a large file the windows reach 69584 bytes back: a 65535-byte comment is found.
  std::string big =
      BuildZip({{"a/data.pkl", "pickle"}, {"a/data/0", std::string(100000, 'x')}}, false);
  big[big.size() - 2] = '\xff';
  big[big.size() - 1] = '\xff';
  big += std::string(65535, 'c');
  EXPECT_EQ(Archive::Parse(B(big)).entries().size(), 2u) << ErrorOf(big);
}

TEST(ZipTorchReading, TorchZipFindsRecordsIgnoringCase) {
  test::P p;
  p.proto(2).op('}').str("w");
  test::PushTensor(p, 2, 0, 2).op('s');
  std::string pickle = p.stop().bytes();
  std::string z = BuildZip({{"Model/data.pkl", pickle},
                            {"Model/DATA/0", std::string(8, '\0')},
                            {"Model/ByteOrder", "little"},
                            {"Model/VERSION", "3\n"}});
  torch::TorchFile tf = torch::ReadTorchZip(B(z));
  ASSERT_EQ(tf.model.storages.size(), 1u);
  EXPECT_TRUE(tf.model.storages[0].present);
  EXPECT_TRUE(tf.model.problems.empty()) << tf.model.problems[0].what;
  EXPECT_EQ(tf.records, (std::vector<std::string>{"Model/ByteOrder", "Model/VERSION"}));
}

TEST(ZipTorchReading, StorageKeysThatFoldAlikeAreAProblem) {
  test::P p;
  p.proto(2).op('}').mark().str("w");
  test::PushTensor(p, 2, 0, 2, "FloatStorage", "a").str("v");
  test::PushTensor(p, 2, 0, 2, "FloatStorage", "A").op('u');
  std::string z = BuildZip({{"ck/data.pkl", p.stop().bytes()},
                            {"ck/data/a", std::string(8, '\0')},
                            {"ck/version", "3\n"}});
  torch::TorchFile tf = torch::ReadTorchZip(B(z));
  bool found = false;
  for (const torch::Problem& pr : tf.model.problems) {
    found = found || Has(pr.what, "storages 'a' and 'A' both read this record");
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace ckpt::zip
