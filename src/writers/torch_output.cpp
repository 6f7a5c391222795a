#include "writers/torch_output.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/perf.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/checked_ranges.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "pickle/writer.h"
#include "torch/torch_file.h"
#include "zip/zip_writer.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

using pickle::Graph;
using pickle::Kind;
using pickle::NodeId;

NodeId IntTuple(Graph& g, const std::vector<int64_t>& values) {
  std::vector<NodeId> items;
  items.reserve(values.size());
  for (int64_t v : values) items.push_back(g.AddInt(v));
  return g.AddTuple(std::move(items));
}

NodeId Call(Graph& g, NodeId callable, NodeId args) {
  NodeId n = g.AddCompound(Kind::kObject);
  pickle::Compound& c = g.mutable_compound(n);
  c.callable = callable;
  c.args = args;
  return n;
}

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> stride(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;)
    stride[i - 1] = stride[i] * std::max<int64_t>(shape[i], 1);
  return stride;
}

// Makes nodes the calls torch.save pickles for contiguous tensors, each with a storage of
// its own (the record `key`); the globals and strings they share are added once.
class TensorCalls {
 public:
  explicit TensorCalls(Graph& g)
      : g_(g),
        odict_(g.AddGlobal("collections", "OrderedDict")),
        rebuild_(g.AddGlobal("torch._utils", "_rebuild_tensor_v2")),
        storage_tag_(g.AddText(Kind::kStr, "storage")),
        cpu_(g.AddText(Kind::kStr, "cpu")) {}

  NodeId odict() const { return odict_; }

  // `node` (a call node: a new one, or a tensor's rebuild call being replaced) becomes the
  // tensor `t` whose storage is record `key`.
  void Make(NodeId node, const TensorSource& t, size_t key) {
    const torch::DTypeInfo& info = torch::Info(t.dtype);
    if (info.storage_class.empty())
      Fail("tensor '{}': torch has no storage class for {}", t.name, info.name);
    auto [cls, fresh] = classes_.emplace(t.dtype, pickle::kNil);
    if (fresh) cls->second = g_.AddGlobal("torch", info.storage_class);
    uint64_t numel = t.size / info.element_size;
    NodeId pid =
        g_.AddTuple({storage_tag_, cls->second, g_.AddText(Kind::kStr, std::to_string(key)), cpu_,
                     g_.AddInt(static_cast<int64_t>(numel))});
    NodeId args = g_.AddTuple({g_.AddPersId(pid), g_.AddInt(0), IntTuple(g_, t.shape),
                               IntTuple(g_, ContiguousStrides(t.shape)), g_.AddBool(false),
                               Call(g_, odict_, g_.AddTuple({}))});
    if (g_.kind(node) != Kind::kObject)
      Fail("internal: tensor '{}' has no call node to become", t.name);
    if (!g_.items(node).empty()) g_.SetItems(node, {});
    if (!g_.pairs(node).empty()) g_.SetPairs(node, {});
    if (!g_.states(node).empty()) g_.SetStates(node, {});
    pickle::Compound& c = g_.mutable_compound(node);
    c.callable = rebuild_;
    c.args = args;
    c.kwargs = pickle::kNil;
    c.construct = pickle::Construct::kReduce;
  }

 private:
  Graph& g_;
  NodeId odict_, rebuild_, storage_tag_, cpu_;
  std::unordered_map<torch::DType, NodeId> classes_;
};

// The pickle torch.save writes for OrderedDict(name -> tensor): storages keyed "0", "1"...
// in the order of the tensors.
std::string StateDictPickle(const std::vector<TensorSource>& tensors,
                            const std::map<std::string, std::string>& aliases,
                            TorchOutputOptions::Root shape) {
  Graph g;
  TensorCalls calls(g);
  NodeId root = Call(g, calls.odict(), g.AddTuple({}));
  std::unordered_map<std::string_view, NodeId> by_name;
  std::vector<NodeId> pairs;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorSource& t = tensors[i];
    NodeId tensor = g.AddCompound(Kind::kObject);
    calls.Make(tensor, t, i);
    by_name.emplace(t.name, tensor);
    pairs.push_back(g.AddText(Kind::kStr, t.name));
    pairs.push_back(tensor);
  }
  for (const auto& [alias, kept] : aliases) {
    auto it = by_name.find(kept);
    if (it == by_name.end()) Fail("alias '{}' names '{}', which is not written", alias, kept);
    pairs.push_back(g.AddText(Kind::kStr, alias));
    pairs.push_back(it->second);
  }
  if (shape != TorchOutputOptions::Root::kStateDict) {
    if (tensors.size() != 1 || !aliases.empty())
      Fail("internal: a universal checkpoint file holds one tensor");
    if (shape == TorchOutputOptions::Root::kTensor) {
      root = pairs[1];
    } else {
      root = g.AddCompound(Kind::kDict);
      std::vector<NodeId> entries = {g.AddText(Kind::kStr, "cat_dim"), g.AddInt(0),
                                     g.AddText(Kind::kStr, "param"), pairs[1]};
      g.SetPairs(root, entries);
    }
  } else {
    g.SetPairs(root, pairs);
  }
  g.root = root;
  pickle::WriteOptions options;
  options.protocol = 2;
  return pickle::Write(g, root, options);
}

// Writes `pickle` and one record per tensor (record i holds tensors[i]) as a torch file at
// `path`, reads it back and checks it; `names` (when set) checks the names tensor i is read
// back under.
uint64_t WriteTorchFile(
    const std::string& path, const std::string& pickle, const std::vector<TensorSource>& tensors,
    const TorchOutputOptions& o,
    const std::function<void(const TensorSource&, const torch::Tensor&)>& names) {
  // torch.save names the top folder after the file (PyTorchStreamWriter: the basename
  // without its extension).
  std::string prefix = fs::path(path).stem().string();
  if (prefix.empty() || prefix.find('/') != std::string::npos) prefix = "archive";
  std::vector<std::pair<std::string, std::string>> small_before = {{"data.pkl", pickle},
                                                                   {"byteorder", "little"}};
  std::vector<zip::RecordSpec> specs;
  for (const auto& [name, bytes] : small_before)
    specs.push_back({prefix + "/" + name, bytes.size()});
  for (size_t i = 0; i < tensors.size(); ++i)
    specs.push_back({fmt::format("{}/data/{}", prefix, i), tensors[i].size});
  specs.push_back({prefix + "/version", 2});
  const std::string version = "3\n";
  zip::ZipPlan zip = zip::ZipPlan::Layout(specs, 64);
  const auto& placed = zip.records();
  const size_t first_tensor = small_before.size();

  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(path, zip.total_size());
  for (const MappedFile* in : o.inputs) out.RequireUnchanged(*in);
  std::vector<uint32_t> crcs(specs.size(), 0);
  auto write_small = [&](size_t i, const std::string& bytes) {
    out.Write(placed[i].data_offset, AsBytes(bytes));
    crcs[i] = Crc32(0, AsBytes(bytes));
  };
  for (size_t i = 0; i < specs.size(); ++i)
    out.Write(placed[i].header_offset, AsBytes(zip.LocalHeader(i)));
  for (size_t i = 0; i < first_tensor; ++i) write_small(i, small_before[i].second);
  write_small(specs.size() - 1, version);
  std::vector<uint64_t> sizes;
  uint64_t bytes = 0;
  for (const TensorSource& t : tensors) {
    sizes.push_back(t.whole ? WholeRange(t.size) : t.size);
    bytes += t.size;
  }
  CheckedRanges checked(tensors.size());  // pieces read back as they land
  std::vector<uint32_t> data_crcs =
      ParallelCrc(sizes, o.threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        const TensorSource& t = tensors[i];
        uint64_t dst = placed[first_tensor + i].data_offset;
        return checked.Write(out, i, [&] {
          return t.whole ? t.write(out, dst, 0, t.size) : t.write(out, dst + off, off, len);
        });
      });
  for (size_t i = 0; i < tensors.size(); ++i) crcs[first_tensor + i] = data_crcs[i];
  for (size_t i = 0; i < specs.size(); ++i)
    out.Write(placed[i].descriptor_offset, AsBytes(zip.Descriptor(i, crcs[i])));
  out.Write(zip.directory_offset(), AsBytes(zip.DirectoryAndEnd(crcs)));
  out.SetDefaultMode();
  out.Sync();

  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was written", path), [&] {
    PerfTimer verify("verify");
    torch::TorchFile back = torch::ReadTorchZip(written.bytes(), ReleasingPages(written));
    const torch::Model& m = back.model;
    if (!m.problems.empty()) Fail("{}: {}", m.problems[0].where, m.problems[0].what);
    if (m.tensors.size() != tensors.size())
      Fail("{} tensors read back, {} written", m.tensors.size(), tensors.size());
    std::vector<bool> seen(tensors.size(), false);
    for (const torch::Tensor& y : m.tensors) {
      size_t i = tensors.size();
      if (y.storage >= 0) {
        const std::string& key = m.storages[y.storage].key;
        auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), i);
        if (ec != std::errc() || end != key.data() + key.size()) i = tensors.size();
      }
      if (i >= tensors.size() || seen[i]) Fail("a tensor is read back from no record written");
      seen[i] = true;
      const TensorSource& x = tensors[i];
      if (names) names(x, y);
      if (y.dtype != x.dtype || y.shape != x.shape || m.storages[y.storage].nbytes != x.size)
        Fail("tensor '{}' is not what was planned", x.name);
    }
    // A tensor record read back as it was written needs only to be where it was written (the
    // reader refuses records that share bytes, so no other write landed in it); the other
    // records are read again.
    const auto& entries = back.archive->entries();
    if (entries.size() != specs.size())
      Fail("{} records read back, {} written", entries.size(), specs.size());
    CrcChecks reread;
    for (size_t i = 0; i < entries.size(); ++i) {
      const zip::Entry& e = entries[i];
      if (e.name != specs[i].name || e.crc32 != crcs[i] || e.size != specs[i].size ||
          e.data_offset != placed[i].data_offset || e.method != zip::Method::kStored)
        Fail("record '{}' is not the one written", e.name);
      if (i >= first_tensor && i - first_tensor < tensors.size() &&
          checked.checked(i - first_tensor))
        continue;
      reread.Add(e.data_offset, e.size, crcs[i], i);
    }
    reread.Run(written, o.threads, [&](size_t i) {
      Fail("record '{}' does not hold the bytes written", entries[i].name);
    });
  });
  out.Commit();
  return bytes;
}

}  // namespace

uint64_t WriteTorchModel(const std::string& path, std::vector<TensorSource> tensors,
                         const std::map<std::string, std::string>& aliases,
                         const TorchOutputOptions& o) {
  RequireDistinctNames(tensors, aliases);
  const std::string pickle = StateDictPickle(tensors, aliases, o.root);
  auto names = [&](const TensorSource& x, const torch::Tensor& y) {
    if (o.root != TorchOutputOptions::Root::kStateDict) return;
    std::vector<std::string> expected = {x.name};
    for (const auto& [alias, kept] : aliases) {
      if (kept == x.name) expected.push_back(alias);
    }
    std::vector<std::string> got = y.names.strings();
    std::sort(expected.begin(), expected.end());
    std::sort(got.begin(), got.end());
    if (got != expected)
      Fail("tensor '{}' is read back as {}", x.name, got.empty() ? "nothing" : got.front());
  };
  return WriteTorchFile(path, pickle, tensors, o, names);
}

uint64_t WriteTorchObject(const std::string& path, pickle::Graph graph,
                          std::vector<GraphTensor> tensors, const TorchOutputOptions& o) {
  if (graph.root == pickle::kNil) Fail("internal: {}: no object to write", path);
  std::vector<TensorSource> sources;
  sources.reserve(tensors.size());
  {
    TensorCalls calls(graph);
    std::unordered_set<NodeId> nodes;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (!nodes.insert(tensors[i].node).second)
        Fail("internal: {}: tensor '{}' given twice", path, tensors[i].source.name);
      calls.Make(tensors[i].node, tensors[i].source, i);
      sources.push_back(std::move(tensors[i].source));
    }
  }
  pickle::WriteOptions options;
  options.protocol = 2;
  const std::string pickle = pickle::Write(graph, graph.root, options);
  graph = {};  // only the bytes are needed from here on
  return WriteTorchFile(path, pickle, sources, o, {});
}

}  // namespace ckpt
