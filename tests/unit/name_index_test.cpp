// NameIndex: every item found by its name and only by it, duplicates reported, and the names
// read where they live (the vector holding them may move).
#include "base/name_index.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace ckpt {
namespace {

TEST(NameIndexTest, FindsEveryItemByNameAcrossGrowthAndReportsDuplicates) {
  std::vector<std::string> names;
  NameIndex index;
  auto name_of = [&names](uint32_t i) -> std::string_view { return names[i]; };
  for (uint32_t i = 0; i < 100000; ++i) {
    names.push_back("model.layers." + std::to_string(i) + ".weight");  // the vector moves
    ASSERT_EQ(index.Insert(names.back(), i, name_of), i);
  }
  EXPECT_EQ(index.size(), 100000u);
  for (uint32_t i = 0; i < 100000; i += 7) {
    EXPECT_EQ(index.Find("model.layers." + std::to_string(i) + ".weight", name_of), i);
  }
  EXPECT_EQ(index.Find("model.layers.100000.weight", name_of), NameIndex::kNone);
  EXPECT_EQ(index.Find("", name_of), NameIndex::kNone);
  // A second item of a name already there is not added; the first one's index comes back.
  names.push_back("model.layers.42.weight");
  EXPECT_EQ(index.Insert(names.back(), 100000, name_of), 42u);
  EXPECT_EQ(index.size(), 100000u);
  // Moved: the new index finds everything, the old one is empty.
  NameIndex moved = std::move(index);
  EXPECT_EQ(moved.size(), 100000u);
  EXPECT_EQ(moved.Find("model.layers.7.weight", name_of), 7u);
  EXPECT_EQ(index.size(), 0u);  // NOLINT(bugprone-use-after-move): defined as empty
  EXPECT_EQ(index.Find("model.layers.7.weight", name_of), NameIndex::kNone);
  moved.Clear();
  EXPECT_EQ(moved.Find("model.layers.1.weight", name_of), NameIndex::kNone);
}

TEST(NameIndexTest, EmptyAndPrefixNamesAreDistinct) {
  std::vector<std::string> names = {"", "a", "ab", "a\0b"};
  names[3] = std::string("a\0b", 3);
  NameIndex index;
  index.Reserve(names.size());
  auto name_of = [&names](uint32_t i) -> std::string_view { return names[i]; };
  for (uint32_t i = 0; i < names.size(); ++i) ASSERT_EQ(index.Insert(names[i], i, name_of), i);
  for (uint32_t i = 0; i < names.size(); ++i) EXPECT_EQ(index.Find(names[i], name_of), i);
}

}  // namespace
}  // namespace ckpt
