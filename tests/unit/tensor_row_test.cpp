// The compact parts of a tensor row (torch/name_list.h, torch/dims.h) behave as the vectors
// they replace.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "torch/dims.h"
#include "torch/model.h"
#include "torch/name_list.h"

namespace ckpt::torch {
namespace {

TEST(NameList, HoldsNamesInOrderAndCopies) {
  NameList n;
  EXPECT_TRUE(n.empty());
  EXPECT_EQ(n.begin(), n.end());
  n.push_back("model.layer.0.weight");
  n.push_back("");
  n.push_back("tied.weight");
  ASSERT_EQ(n.size(), 3u);
  EXPECT_EQ(n.front(), "model.layer.0.weight");
  EXPECT_EQ(n[1], "");
  EXPECT_EQ(n[2], "tied.weight");
  EXPECT_EQ(n.strings(), (std::vector<std::string>{"model.layer.0.weight", "", "tied.weight"}));
  NameList copy = n;
  EXPECT_EQ(copy, n);
  copy.push_back("x");
  EXPECT_NE(copy, n);
  EXPECT_EQ(n.size(), 3u);
  NameList moved = std::move(copy);
  EXPECT_EQ(moved.size(), 4u);
  EXPECT_EQ(moved[3], "x");
  // Same concatenated bytes, different boundaries.
  EXPECT_NE((NameList{"ab", "c"}), (NameList{"a", "bc"}));
  EXPECT_EQ(NameList{}, NameList{});
  // A name of the list itself, appended while the block grows.
  NameList self{"abc"};
  for (int i = 0; i < 5; ++i) self.push_back(self[0]);
  EXPECT_EQ(self.strings(), std::vector<std::string>(6, "abc"));
}

TEST(NameList, ManyNamesKeepTheirValues) {
  NameList n;
  for (int i = 0; i < 10000; ++i) n.push_back(std::to_string(i));
  ASSERT_EQ(n.size(), 10000u);
  int i = 0;
  for (std::string_view s : n) EXPECT_EQ(s, std::to_string(i++));
}

TEST(Dims, InlineAndHeapAlike) {
  Dims d{2, 3};
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d.vec(), (std::vector<int64_t>{2, 3}));
  for (int64_t v = 0; v < 10; ++v) d.push_back(v);  // past the inline room
  ASSERT_EQ(d.size(), 12u);
  EXPECT_EQ(d[0], 2);
  EXPECT_EQ(d[11], 9);
  Dims copy = d;
  EXPECT_EQ(copy, d);
  Dims moved = std::move(copy);
  EXPECT_EQ(moved, d);
  EXPECT_TRUE(copy.empty());  // NOLINT(bugprone-use-after-move): a moved-from Dims is empty
  Dims small{7};
  moved = small;  // heap to inline
  EXPECT_EQ(moved.vec(), (std::vector<int64_t>{7}));
  moved = std::move(d);  // inline to heap
  EXPECT_EQ(moved.size(), 12u);
  EXPECT_EQ(moved, (std::vector<int64_t>{2, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_NE(Dims({1, 2}), Dims({1, 2, 3}));
  moved.clear();
  EXPECT_TRUE(moved.empty());
}

TEST(TensorRow, TopKeyIsAPrefixOfTheFirstName) {
  Tensor t;
  EXPECT_EQ(t.top_key(), "");
  t.names.push_back("optimizer.state.0.exp_avg");
  t.top_size = 9;
  EXPECT_EQ(t.top_key(), "optimizer");
}

}  // namespace
}  // namespace ckpt::torch
