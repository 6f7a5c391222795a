// TorchRewrite's read-back check (rewriters/rewrite_verify.cpp): a plan that would put a tensor
// somewhere other than the input had it is caught after writing, and nothing is replaced.
#include "rewriters/torch_rewrite.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "file/checkpoint_file.h"
#include "test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using test::P;
using test::PushTensor;

class TorchRewriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt-rewrite-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // {"w": storage "0" of 8 floats, view of 3 from element 2}
    P p;
    p.proto(2).op('}').str("w");
    std::string pickle = PushTensor(p, 8, 2, 3).op('s').stop().bytes();
    std::string storage(32, '\0');
    for (size_t i = 0; i < storage.size(); ++i) storage[i] = static_cast<char>(i);
    bytes_ =
        test::BuildZip({{"ck/data.pkl", pickle}, {"ck/data/0", storage}, {"ck/version", "3\n"}});
    input_ = dir_ + "/in.pt";
    std::ofstream(input_, std::ios::binary) << bytes_;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // The plan that keeps storage 0 as it is, changed by `tamper`; returns Write's error.
  std::string WriteWith(const std::function<void(RewritePlan&)>& tamper) {
    CheckpointFile f = OpenCheckpoint(input_);
    const torch::Model& m = f.torch->model;
    EXPECT_EQ(m.tensors.size(), 1u);
    RewritePlan plan;
    plan.storages.push_back({0, 0, m.storages[0].nbytes});
    plan.tensor_storage = {0};
    plan.tensor_offset = {m.tensors[0].offset};
    tamper(plan);
    TorchRewrite rewrite(f, std::move(plan));
    std::string out = dir_ + "/out.pt";
    return test::ErrorOf([&] { rewrite.Write(out, 2); });
  }

  std::string dir_, input_, bytes_;
};

TEST_F(TorchRewriteTest, AFaithfulPlanWritesAFileThatReadsBack) {
  EXPECT_EQ(WriteWith([](RewritePlan&) {}), "");
  CheckpointFile out = OpenCheckpoint(dir_ + "/out.pt");
  ASSERT_EQ(out.torch->model.tensors.size(), 1u);
  EXPECT_EQ(out.torch->model.tensors[0].offset, 2);
  EXPECT_EQ(out.torch->model.tensors[0].shape, (std::vector<int64_t>{3}));
}

TEST_F(TorchRewriteTest, ATensorMovedByThePlanIsCaughtAndNothingIsWritten) {
  std::string error = WriteWith([](RewritePlan& p) { p.tensor_offset[0] += 1; });
  EXPECT_NE(error.find("tensor 'w' moved inside its storage"), std::string::npos) << error;
  EXPECT_NE(error.find("nothing was replaced"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(dir_ + "/out.pt"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// The read-back is checked against the plan (a planned stride is what the file must show),
// not against the input.
TEST_F(TorchRewriteTest, APlannedStrideIsWhatTheFileShows) {
  EXPECT_EQ(WriteWith([](RewritePlan& p) { p.tensor_stride = {{2}}; }), "");
  CheckpointFile out = OpenCheckpoint(dir_ + "/out.pt");
  ASSERT_EQ(out.torch->model.tensors.size(), 1u);
  EXPECT_EQ(out.torch->model.tensors[0].stride, (std::vector<int64_t>{2}));
}

}  // namespace
}  // namespace ckpt
