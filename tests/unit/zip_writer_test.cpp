#include "zip/zip_writer.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include "test_util.h"
#include "zip/zip_archive.h"

namespace ckpt::zip {
namespace {

using test::B;

// Assembles a whole archive in memory from a plan.
std::string Assemble(const ZipPlan& plan, const std::vector<std::string>& data) {
  std::string out(plan.total_size(), '\0');
  std::vector<uint32_t> crcs;
  for (size_t i = 0; i < data.size(); ++i) {
    const PlacedRecord& r = plan.records()[i];
    uint32_t crc = static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(data[i].data()),
                                               static_cast<uInt>(data[i].size())));
    crcs.push_back(crc);
    out.replace(r.header_offset, plan.LocalHeader(i).size(), plan.LocalHeader(i));
    out.replace(r.data_offset, data[i].size(), data[i]);
    out.replace(r.descriptor_offset, r.descriptor_size, plan.Descriptor(i, crc));
  }
  std::string tail = plan.DirectoryAndEnd(crcs);
  EXPECT_EQ(plan.directory_offset() + tail.size(), plan.total_size());
  out.replace(plan.directory_offset(), tail.size(), tail);
  return out;
}

TEST(ZipWriter, MatchesTorchsOwnBytesForTheFixture) {
  // Re-lay out the fixture's records: torch 1.13 wrote it, so every byte must agree.
  std::string original = test::ReadFixture("small.pt");
  Archive a = Archive::Parse(B(original));
  std::vector<RecordSpec> specs;
  std::vector<std::string> data;
  for (const Entry& e : a.entries()) {
    specs.push_back({e.name, e.size});
    data.push_back(ReadRecord(B(original), e, 1 << 20));
  }
  EXPECT_EQ(Assemble(ZipPlan::Layout(specs), data), original);
}

TEST(ZipWriter, DataIsAlignedAndReadable) {
  std::vector<RecordSpec> specs = {
      {"x/data.pkl", 5}, {"x/data/0", 100}, {"x/data/1", 0}, {"x/version", 2}};
  std::vector<std::string> data = {"hello", std::string(100, 'a'), "", "3\n"};
  for (uint64_t alignment : {1u, 64u, 4096u}) {
    ZipPlan plan = ZipPlan::Layout(specs, alignment);
    for (const PlacedRecord& r : plan.records()) EXPECT_EQ(r.data_offset % alignment, 0u);
    std::string z = Assemble(plan, data);
    Archive a = Archive::Parse(B(z));
    ASSERT_EQ(a.entries().size(), 4u);
    EXPECT_EQ(ReadRecord(B(z), *a.Find("x/data/0"), 1000), data[1]);
    EXPECT_EQ(a.Find("x/data/0")->data_offset, plan.records()[1].data_offset);
  }
  EXPECT_ANY_THROW(ZipPlan::Layout(specs, 48));
}

TEST(ZipWriter, Zip64FieldsForLargeRecords) {
  // Only the layout: a 5 GiB record is never materialised.
  ZipPlan plan = ZipPlan::Layout({{"a/data.pkl", 10}, {"a/data/0", 5ull << 30}, {"a/version", 2}});
  const auto& r = plan.records();
  EXPECT_TRUE(r[1].zip64);
  EXPECT_EQ(r[1].descriptor_size, 24u);
  EXPECT_TRUE(r[2].zip64);  // its offset is past 4 GiB
  EXPECT_EQ(r[1].data_offset % 64, 0u);
  EXPECT_EQ(r[2].data_offset % 64, 0u);
  std::string h = plan.LocalHeader(2);
  EXPECT_NE(h.find("FB"), std::string::npos);
  EXPECT_EQ(LoadLE<uint16_t>(h.data() + 30 + r[2].name.size()), 1u);  // zip64 extra first
}

}  // namespace
}  // namespace ckpt::zip
