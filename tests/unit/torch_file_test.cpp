#include "torch/torch_file.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "base/error.h"
#include "ops/checkpoint_file.h"
#include "ops/inspect_report.h"
#include "test_util.h"

namespace ckpt::torch {
namespace {

using test::B;
using test::BuildZip;
using test::P;

const Tensor* Named(const Model& m, const std::string& name) {
  for (const Tensor& t : m.tensors) {
    if (std::find(t.names.begin(), t.names.end(), name) != t.names.end()) return &t;
  }
  return nullptr;
}

// Pushes _rebuild_tensor_v2(storage('0', numel), offset, (size,), (1,), False, {}).
P& PushTensor(P& p, int32_t numel, int32_t offset, int32_t size,
              const char* storage_class = "FloatStorage") {
  return p.global("torch._utils", "_rebuild_tensor_v2")
      .mark()
      .mark()
      .str("storage")
      .global("torch", storage_class)
      .str("0")
      .str("cpu")
      .bin_int(numel)
      .op('t')
      .op('Q')
      .bin_int(offset)
      .mark()
      .bin_int(size)
      .op('t')
      .mark()
      .bin_int(1)
      .op('t')
      .op(0x89)
      .global("collections", "OrderedDict")
      .op(')')
      .op('R')
      .op('t')
      .op('R');
}

// data.pkl for {"w": <tensor as PushTensor makes it>}
std::string TensorPickle(int32_t numel, int32_t offset, int32_t size,
                         const char* storage_class = "FloatStorage") {
  P p;
  p.proto(2).op('}').str("w");
  return PushTensor(p, numel, offset, size, storage_class).op('s').stop().bytes();
}

std::string Checkpoint(const std::string& pickle, const std::string& storage) {
  return BuildZip({{"ck/data.pkl", pickle}, {"ck/data/0", storage}, {"ck/version", "3\n"}});
}

// The error reading the torch zip `f` gives, or "".
std::string ZipError(const std::string& f) {
  return test::ErrorOf([&] { ReadTorchZip(B(f)); });
}

bool HasProblem(const Model& m, const std::string& needle) {
  for (const Problem& p : m.problems) {
    if ((p.where + ": " + p.what).find(needle) != std::string::npos) return true;
  }
  return false;
}

TEST(TorchZip, HandBuiltTensorIsDescribed) {
  std::string f = Checkpoint(TensorPickle(8, 2, 3), std::string(32, '\0'));
  TorchFile tf = ReadTorchZip(B(f));
  EXPECT_EQ(tf.prefix, "ck");
  ASSERT_EQ(tf.model.tensors.size(), 1u);
  const Tensor& t = tf.model.tensors[0];
  EXPECT_EQ(t.names[0], "w");
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.byte_begin, 8u);
  EXPECT_EQ(t.byte_end, 20u);
  EXPECT_TRUE(tf.model.problems.empty());
}

TEST(TorchZip, ViewOutsideItsStorageIsAProblem) {
  std::string f = Checkpoint(TensorPickle(8, 6, 3), std::string(32, '\0'));
  TorchFile tf = ReadTorchZip(B(f));
  EXPECT_TRUE(HasProblem(tf.model, "storage '0' has 32 bytes")) << tf.model.problems.size();
}

TEST(TorchZip, RecordSizeMustMatchThePickle) {
  std::string f = Checkpoint(TensorPickle(8, 0, 3), std::string(20, '\0'));
  EXPECT_TRUE(HasProblem(ReadTorchZip(B(f)).model, "record holds 20 bytes"));
  std::string missing = BuildZip({{"ck/data.pkl", TensorPickle(8, 0, 3)}, {"ck/version", "3\n"}});
  EXPECT_TRUE(HasProblem(ReadTorchZip(B(missing)).model, "missing"));
}

TEST(TorchZip, StructuralErrorsAreClear) {
  EXPECT_NE(ZipError(BuildZip({{"data.pkl", "x"}})).find("not in a folder"), std::string::npos);
  EXPECT_NE(ZipError(BuildZip({{"a/other", "x"}})).find("no a/data.pkl"), std::string::npos);
  EXPECT_NE(ZipError(BuildZip({{"a/data.pkl", "x"}, {"a/constants.pkl", "x"}})).find("TorchScript"),
            std::string::npos);
  EXPECT_NE(ZipError(BuildZip({{"a/data.pkl", "\x80\x02\xfe."}})).find("a/data.pkl: pickle offset"),
            std::string::npos);
}

TEST(TorchZip, UnknownStorageClassAndBadArgumentsAreProblems) {
  std::string f = Checkpoint(TensorPickle(8, 0, 3, "WeirdStorage"), std::string(32, '\0'));
  EXPECT_TRUE(HasProblem(ReadTorchZip(B(f)).model, "unknown storage class"));
}

TEST(TorchZip, RebuildV3OverUntypedStorage) {
  // torch >= 2.1 saves new dtypes as UntypedStorage (numel = bytes) + _rebuild_tensor_v3.
  std::string pkl = P().proto(2).op('}').str("f8")
      .global("torch._utils", "_rebuild_tensor_v3")
      .mark()
      .mark().str("storage").global("torch", "UntypedStorage").str("0").str("cpu").bin_int(16).op('t').op('Q')
      .bin_int(4)
      .mark().bin_int(2).bin_int(3).op('t')
      .mark().bin_int(3).bin_int(1).op('t')
      .op(0x89)
      .global("collections", "OrderedDict").op(')').op('R')
      .global("torch", "float8_e4m3fn")
      .op('t').op('R')
      .op('s').stop().bytes();
  TorchFile tf = ReadTorchZip(B(Checkpoint(pkl, std::string(16, '\0'))));
  ASSERT_EQ(tf.model.tensors.size(), 1u);
  const Tensor& t = tf.model.tensors[0];
  EXPECT_EQ(t.dtype, DType::kFloat8E4M3FN);
  EXPECT_EQ(t.byte_begin, 4u);
  EXPECT_EQ(t.byte_end, 10u);
  EXPECT_EQ(tf.model.storages[0].nbytes, 16u);
  EXPECT_TRUE(tf.model.problems.empty());
}

TEST(TorchZip, GlobalsHiddenBehindTheMemoAreStillSeen) {
  // GLOBAL memoized then fetched with BINGET: scanners that only read GLOBAL text at the
  // call site miss it; the graph keeps the one global node either way.
  std::string pkl = P().proto(2).global("os", "system").put(1).op('0')
      .op('}').str("x").get(1).str("true").op(0x85).op('R').op('s').stop().bytes();
  TorchFile tf = ReadTorchZip(B(Checkpoint(pkl, "")));
  bool found = false;
  for (pickle::NodeId id = 0; id < tf.model.graph.nodes.size(); ++id) {
    if (tf.model.graph.kind(id) == pickle::Kind::kGlobal &&
        tf.model.graph.GlobalText(id) == "os.system") {
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

// 60 levels of [previous, previous] hold 2^60 paths in a few hundred bytes. Without a
// tensor at the bottom there is nothing to name and each level is walked once; with one,
// the walk gives up after a bounded number of repeated steps, quickly, with a clear reason.
std::string Laughs(bool tensor_at_the_bottom) {
  P p;
  p.proto(2).op(']').put(0);
  if (tensor_at_the_bottom) PushTensor(p, 4, 0, 4).op('a');
  for (uint8_t level = 1; level < 60; ++level)
    p.op('(').get(level - 1).get(level - 1).op('l').put(level);
  return p.stop().bytes();
}

TEST(TorchZip, SharedReferencesCannotMakeTheWalkExplode) {
  Model quiet = ReadTorchZip(B(Checkpoint(Laughs(false), ""))).model;
  EXPECT_TRUE(quiet.tensors.empty());
  EXPECT_TRUE(quiet.problems.empty());
  std::string error = ZipError(Checkpoint(Laughs(true), std::string(16, '\0')));
  EXPECT_NE(error.find("more than 250000 steps to walk again through shared references; refusing"),
            std::string::npos)
      << error;
  // A list of 2M references to one tensor: refused once the steps run out.
  P many;
  many.proto(2).op(']').put(0);
  PushTensor(many, 4, 0, 4).put(1).op('a');
  std::string refs;
  for (int i = 0; i < 2'000'000; ++i)
    refs +=
        "h\x01"
        "a";
  many.raw(refs);
  error = ZipError(Checkpoint(many.stop().bytes(), std::string(16, '\0')));
  EXPECT_NE(error.find("steps to walk again through shared references"), std::string::npos)
      << error;
  // Few references under a 1 MiB key: the names would take 300 MiB.
  P long_names;
  long_names.proto(2).op('}').str(std::string(1 << 20, 'k')).op(']').put(0);
  PushTensor(long_names, 4, 0, 4).put(1).op('a');
  std::string more;
  for (int i = 0; i < 300; ++i)
    more +=
        "h\x01"
        "a";
  long_names.raw(more).op('s');
  error = ZipError(Checkpoint(long_names.stop().bytes(), std::string(16, '\0')));
  EXPECT_NE(error.find("tensor names would take more than 256 MiB"), std::string::npos) << error;

  // A dict with a 1 MiB key, shared 100 times: the paths alone would be 100 MiB.
  P long_paths;
  long_paths.proto(2).op(']').put(0).op('}').put(1).str(std::string(1 << 20, 'k'));
  PushTensor(long_paths, 4, 0, 4).op('s').op('a');
  std::string again;
  for (int i = 0; i < 100; ++i)
    again +=
        "h\x01"
        "a";
  long_paths.raw(again);
  error = ZipError(Checkpoint(long_paths.stop().bytes(), std::string(16, '\0')));
  EXPECT_NE(error.find("paths through shared references would be more than 64 MiB long"),
            std::string::npos)
      << error;

  // A container shared by two paths is walked by each: its tensor gets both names.
  P two;
  two.proto(2).op('}').op('(').str("a").op('}').put(0).str("w");
  PushTensor(two, 4, 0, 4).op('s').str("b").get(0).op('u');
  Model m = ReadTorchZip(B(Checkpoint(two.stop().bytes(), std::string(16, '\0')))).model;
  ASSERT_EQ(m.tensors.size(), 1u);
  EXPECT_EQ(m.tensors[0].names, (std::vector<std::string>{"a.w", "b.w"}));
}

TEST(TorchZip, RealFixtureMatchesWhatTorchSaved) {
  std::string f = test::ReadFixture("small.pt");
  TorchFile tf = ReadTorchZip(B(f));
  const Model& m = tf.model;
  EXPECT_TRUE(m.problems.empty());
  const Tensor* embed = Named(m, "model.embed.weight");
  const Tensor* head = Named(m, "model.head.weight");
  ASSERT_NE(embed, nullptr);
  ASSERT_NE(head, nullptr);
  EXPECT_NE(embed, head);  // two view objects...
  EXPECT_EQ(embed->storage, head->storage);  // ...over one storage, same bytes
  EXPECT_EQ(embed->byte_begin, head->byte_begin);
  EXPECT_EQ(embed->byte_end, 16u * 4);
  EXPECT_EQ(m.storages[embed->storage].nbytes, 64u * 4);  // whole flat storage saved
  const Tensor* proj = Named(m, "model.proj.weight");
  ASSERT_NE(proj, nullptr);
  EXPECT_EQ(proj->kind, "parameter");
  EXPECT_TRUE(proj->requires_grad);
  EXPECT_EQ(proj->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(proj->stride, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(Named(m, "model.norm.bias")->dtype, DType::kFloat16);
  EXPECT_EQ(Named(m, "mask")->dtype, DType::kBool);
}

TEST(TorchLegacy, RealFixtureMatchesTheZipOne) {
  Model zip = ReadTorchZip(B(test::ReadFixture("small.pt"))).model;
  std::string legacy_bytes = test::ReadFixture("small_legacy.pt");
  ASSERT_TRUE(LooksLikeTorchLegacy(B(legacy_bytes)));
  TorchFile legacy = ReadTorchLegacy(B(legacy_bytes));
  EXPECT_TRUE(legacy.model.problems.empty());
  ASSERT_EQ(zip.tensors.size(), legacy.model.tensors.size());
  for (const Tensor& t : zip.tensors) {
    const Tensor* o = Named(legacy.model, t.names[0]);
    ASSERT_NE(o, nullptr) << t.names[0];
    EXPECT_EQ(o->shape, t.shape);
    EXPECT_EQ(o->stride, t.stride);
    EXPECT_EQ(o->dtype, t.dtype);
    EXPECT_EQ(o->byte_end - o->byte_begin, t.byte_end - t.byte_begin);
  }
  // Every byte accounted for: storages end exactly at the end of the file.
  uint64_t end = 0;
  for (const Storage& s : legacy.model.storages) end = std::max(end, s.data_offset + s.nbytes);
  EXPECT_EQ(end, legacy_bytes.size());
}

// Every prefix of a real file, and every single-byte corruption of its metadata, gives an
// error or a described file, never a crash (run under ASan+UBSan in CI).
void Torture(const std::string& name) {
  std::string f = test::ReadFixture(name);
  size_t errors = 0;
  for (size_t n = 0; n < f.size(); ++n) {
    try {
      auto format = DetectFormat(B(f.substr(0, n)));
      std::string cut = f.substr(0, n);
      if (format == Format::kTorchZip) ReadTorchZip(B(cut));
      else if (format == Format::kTorchLegacy) ReadTorchLegacy(B(cut));
      else ++errors;
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GE(errors, f.size() / 2) << "most truncations must be detected";
  for (size_t i = 0; i < f.size(); ++i) {
    std::string bad = f;
    bad[i] = static_cast<char>(bad[i] ^ 0x5a);
    try {
      if (name.find("legacy") != std::string::npos) ReadTorchLegacy(B(bad));
      else ReadTorchZip(B(bad));
    } catch (const Error&) {
    }
  }
}

TEST(Torture, ZipFixture) { Torture("small.pt"); }
TEST(Torture, LegacyFixture) { Torture("small_legacy.pt"); }

TEST(InspectReport, ByteMapAddsUpToTheFileSize) {
  for (const char* name : {"small.pt", "small_legacy.pt", "small.safetensors"}) {
    CheckpointFile f = OpenCheckpoint(std::string(CKPT_FIXTURES_DIR) + "/" + name);
    FileReport r = BuildReport(f);
    uint64_t sum = 0;
    for (const auto& [label, bytes] : r.byte_map) sum += bytes;
    EXPECT_EQ(sum, r.file_bytes) << name;
    EXPECT_EQ(r.used_bytes + r.wasted_bytes, r.storage_bytes) << name;
    uint64_t key_sum = 0;
    for (const Rollup& k : r.by_key) key_sum += k.storage_bytes;
    EXPECT_EQ(key_sum, r.storage_bytes) << name;
  }
}

}  // namespace
}  // namespace ckpt::torch
