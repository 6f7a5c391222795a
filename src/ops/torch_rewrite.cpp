#include "ops/torch_rewrite.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "base/error.h"
#include "base/perf.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "ops/piece_writer.h"
#include "ops/tensor_bytes.h"
#include "pickle/graph_compare.h"
#include "pickle/writer.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace {

constexpr uint64_t kMaxSmallRecord = 256ull << 20;

using pickle::Kind;
using pickle::NodeId;

}  // namespace

TorchRewrite::TorchRewrite(CheckpointFile& input, RewritePlan plan)
    : in_(input), plan_(std::move(plan)) {
  if (!in_.torch) Fail("{}: not a torch checkpoint", in_.path);
  PerfTimer timer("rewrite pickle and lay out");
  RewriteGraph();
  SerializePickle();
  LayOut();
}

void TorchRewrite::RewriteGraph() {
  torch::Model& m = in_.torch->model;
  pickle::Graph& g = m.graph;
  if (plan_.tensor_storage.size() != m.tensors.size() ||
      plan_.bare_storage.size() != m.bare_refs.size()) {
    Fail("internal: plan does not cover every tensor");
  }
  NodeId tag = g.AddText(Kind::kStr, "storage");
  for (OutStorage& s : plan_.storages) {
    const torch::Storage& src = m.storages[s.source];
    NodeId old_pid = g.compound(src.first_ref).args;
    NodeId cls = g.items(old_pid)[1];
    uint64_t out_es = torch::ElementSize(src.dtype);
    if (s.convert) {
      if (src.dtype == torch::DType::kFloat32) {
        cls = g.AddGlobal("torch",
                          s.to == kernels::Half::kBFloat16 ? "BFloat16Storage" : "HalfStorage");
        out_es = 2;
      } else if (src.dtype != torch::DType::kUntyped) {
        Fail("internal: converting a {} storage", torch::Name(src.dtype));
      }
    }
    NodeId location = g.items(old_pid)[3];
    if (s.end < s.begin || s.size() % out_es != 0 || s.end > src.nbytes) {
      Fail("internal: bad output range [{}, {}) of storage '{}'", s.begin, s.end, src.key);
    }
    s.key_node = g.AddText(Kind::kStr, "");
    NodeId numel = g.AddInt(static_cast<int64_t>(s.size() / out_es));
    NodeId pid = g.AddTuple({tag, cls, s.key_node, location, numel});
    s.persid = g.AddPersId(pid);
  }
  for (size_t j = 0; j < m.tensors.size(); ++j) {
    const torch::Tensor& t = m.tensors[j];
    if (t.storage < 0) continue;
    NodeId offset = g.AddInt(plan_.tensor_offset[j]);
    NodeId stride = pickle::kNil;
    if (!plan_.tensor_stride.empty() && !plan_.tensor_stride[j].empty()) {
      std::vector<NodeId> dims;
      for (int64_t v : plan_.tensor_stride[j]) dims.push_back(g.AddInt(v));
      stride = g.AddTuple(std::move(dims));
    }
    const OutStorage& os = plan_.storages[plan_.tensor_storage[j]];
    // _rebuild_tensor_v3 over an UntypedStorage names the dtype itself (argument 6).
    NodeId dtype = pickle::kNil;
    if (os.convert && m.storages[t.storage].dtype == torch::DType::kUntyped) {
      dtype = g.AddGlobal("torch", os.to == kernels::Half::kBFloat16 ? "bfloat16" : "float16");
    }
    auto& items = g.mutable_compound(t.args).items;
    items[0] = os.persid;
    items[1] = offset;
    if (stride != pickle::kNil) items[3] = stride;
    if (dtype != pickle::kNil) {
      if (items.size() < 7) Fail("internal: tensor '{}' has no dtype argument", t.names[0]);
      items[6] = dtype;
    }
  }
  for (size_t k = 0; k < m.bare_refs.size(); ++k) {
    NodeId pid = g.compound(plan_.storages[plan_.bare_storage[k]].persid).args;
    g.mutable_compound(m.bare_refs[k].first).args = pid;
  }
}

void TorchRewrite::SerializePickle() {
  torch::Model& m = in_.torch->model;
  pickle::Graph& g = m.graph;
  std::unordered_map<NodeId, int32_t> owner;
  for (size_t i = 0; i < plan_.storages.size(); ++i)
    owner[plan_.storages[i].persid] = static_cast<int32_t>(i);
  for (size_t k = 0; k < m.bare_refs.size(); ++k)
    owner[m.bare_refs[k].first] = plan_.bare_storage[k];
  int next = 0;
  pickle::WriteOptions o;
  o.protocol = std::max(2, g.protocol);
  o.before_persid = [&](NodeId p) {
    auto it = owner.find(p);
    if (it == owner.end()) {
      Fail(
          "the pickle refers to a storage at offset {} that ckptool cannot map; refusing to "
          "rewrite",
          g.at(p).stream_offset);
    }
    OutStorage& s = plan_.storages[it->second];
    if (s.key.empty()) {
      s.key = std::to_string(next++);
      g.SetText(s.key_node, s.key);
    }
  };
  pickle_ = pickle::Write(g, g.root, o);
}

void TorchRewrite::LayOut() {
  const torch::TorchFile& tf = *in_.torch;
  Bytes file = in_.map.bytes();
  std::string prefix = tf.container == torch::Container::kZip ? tf.prefix : "archive";
  uint64_t alignment = tf.storage_alignment;                       // validated by the reader
  std::vector<std::pair<std::string, std::string>> before, after;  // metadata records
  if (tf.archive) {
    // Keep every record that is not a storage, in its place relative to the storages.
    bool seen_storage = false;
    std::string data_dir = tf.prefix + "/data/";
    for (const zip::Entry& e : tf.archive->entries()) {
      bool is_data = e.name.rfind(data_dir, 0) == 0;
      if (is_data) {
        seen_storage = true;
        continue;  // referenced storages are rewritten, unreferenced ones are dead bytes
      }
      if (e.name == tf.prefix + "/data.pkl") continue;
      std::string name = e.name.substr(std::min(e.name.size(), tf.prefix.size() + 1));
      std::string bytes = zip::ReadRecord(file, e, kMaxSmallRecord);
      (seen_storage ? after : before).emplace_back(name, std::move(bytes));
    }
  } else {
    if (tf.byteorder == "big") before.emplace_back("byteorder", "big");
    after.emplace_back("version", "3\n");
  }

  std::vector<zip::RecordSpec> specs;
  auto add_small = [&](const std::string& name, std::string bytes) {
    specs.push_back({prefix + "/" + name, bytes.size()});
    records_.push_back({std::move(bytes), -1});
  };
  add_small("data.pkl", pickle_);
  for (auto& [name, bytes] : before) add_small(name, std::move(bytes));
  std::vector<int32_t> by_key;
  for (size_t i = 0; i < plan_.storages.size(); ++i) {
    if (!plan_.storages[i].key.empty()) by_key.push_back(static_cast<int32_t>(i));
  }
  std::sort(by_key.begin(), by_key.end(), [&](int32_t a, int32_t b) {
    return std::stoull(plan_.storages[a].key) < std::stoull(plan_.storages[b].key);
  });
  for (int32_t i : by_key) {
    const OutStorage& s = plan_.storages[i];
    specs.push_back({prefix + "/data/" + s.key, s.size()});
    records_.push_back({"", i});
  }
  for (auto& [name, bytes] : after) add_small(name, std::move(bytes));
  zip_ = zip::ZipPlan::Layout(specs, alignment);
}

bool TorchRewrite::SourceIsStored(const OutStorage& s, uint64_t* file_offset) const {
  const torch::Storage& src = in_.torch->model.storages[s.source];
  if (src.compressed) return false;
  *file_offset = src.data_offset + s.begin;
  return true;
}

void TorchRewrite::Write(const std::string& final_path, unsigned threads, const WriteStats& stats) {
  const torch::TorchFile& tf = *in_.torch;
  Bytes file = in_.map.bytes();
  uint64_t total = zip_.total_size();
  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(final_path, total);
  out.RequireUnchanged(in_.map);
  const auto& placed = zip_.records();
  std::vector<uint32_t> crcs(records_.size(), 0);
  std::vector<uint64_t> sizes(records_.size(), 0);
  std::vector<bool> reuse(records_.size(), false);
  for (size_t i = 0; i < records_.size(); ++i) {
    out.Write(placed[i].header_offset, AsBytes(zip_.LocalHeader(i)));
    const Record& r = records_[i];
    if (r.storage < 0) {
      out.Write(placed[i].data_offset, AsBytes(r.data));
      crcs[i] = Crc32(0, AsBytes(r.data));
      continue;
    }
    const OutStorage& s = plan_.storages[r.storage];
    const torch::Storage& src = tf.model.storages[s.source];
    uint64_t offset;
    if (!SourceIsStored(s, &offset) || s.gather_tensor >= 0) {
      sizes[i] = WholeRange(s.size());  // the inflated stream or the gather
      continue;
    }
    sizes[i] = s.size();
    if (tf.archive && s.begin == 0 && !s.convert) {
      const zip::Entry* e = tf.archive->Find(src.record);
      if (e != nullptr && e->size == s.end) {
        reuse[i] = true;
        crcs[i] = e->crc32;
      }
    }
  }

  overflow_.assign(plan_.storages.size(), 0);
  // Pieces are in output coordinates; a converted storage reads twice as many input bytes.
  std::vector<uint32_t> data_crcs =
      ParallelCrc(sizes, threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) -> uint32_t {
        size_t si = static_cast<size_t>(records_[i].storage);
        const OutStorage& s = plan_.storages[si];
        uint64_t dst = placed[i].data_offset;
        uint64_t src_offset;
        uint32_t crc = 0;
        if (s.gather_tensor >= 0) {
          crc = WriteGathered(s, out, dst);
          if (stats.bytes_done) *stats.bytes_done += s.size();
          return crc;
        }
        if (SourceIsStored(s, &src_offset)) {
          uint64_t scale = s.convert ? 2 : 1;
          if (reuse[i]) {
            out.CopyFrom(in_.map.fd(), src_offset + off, dst + off, len);
          } else {
            MappedFile::Window window(in_.map, src_offset + off * scale, len * scale);
            crc = WritePiece(si, window.bytes(), out, dst + off);
          }
          if (stats.bytes_done) *stats.bytes_done += len * scale;
          return crc;
        }
        // Deflated source: inflate the record and keep this storage's range (whole elements:
        // a float32 split across two inflated chunks is carried over).
        const torch::Storage& src = tf.model.storages[s.source];
        const zip::Entry* e = tf.archive->Find(src.record);
        uint64_t pos = 0, written = 0;
        std::string carry;
        zip::StreamRecord(file, *e, [&](Bytes chunk) {
          uint64_t lo = std::max(pos, s.begin), hi = std::min(pos + chunk.size(), s.end);
          pos += chunk.size();
          if (lo >= hi) return;
          carry.append(AsText(chunk.subspan(lo - (pos - chunk.size()), hi - lo)));
          size_t usable = s.convert ? carry.size() / 4 * 4 : carry.size();
          uint32_t part_crc = WritePiece(si, AsBytes(std::string_view(carry).substr(0, usable)),
                                         out, dst + written);
          uint64_t out_len = s.convert ? usable / 2 : usable;
          crc = written ? Crc32Combine(crc, part_crc, out_len) : part_crc;
          written += out_len;
          carry.erase(0, usable);
          if (stats.bytes_done) *stats.bytes_done += usable;
        });
        return crc;
      });
  for (size_t i = 0; i < records_.size(); ++i) {
    if (records_[i].storage >= 0 && !reuse[i]) crcs[i] = data_crcs[i];
    out.Write(placed[i].descriptor_offset, AsBytes(zip_.Descriptor(i, crcs[i])));
  }
  out.Write(zip_.directory_offset(), AsBytes(zip_.DirectoryAndEnd(crcs)));
  out.SetMode(in_.map.mode(), in_.map.uid(), in_.map.gid());
  {
    PerfTimer sync("fsync");
    out.Sync();
  }
  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was replaced", in_.path),
              [&] {
                PerfTimer verify("verify");
                Verify(written, threads);
              });
  PerfTimer commit("rename and fsync folder");
  out.Commit();
}

void TorchRewrite::Verify(const MappedFile& out, unsigned threads) const {
  torch::TorchFile o = torch::ReadTorchZip(out.bytes());
  const torch::Model& a = in_.torch->model;
  const torch::Model& b = o.model;
  if (!b.problems.empty()) Fail("{}: {}", b.problems[0].where, b.problems[0].what);
  std::string diff = pickle::CompareGraphs(a.graph, a.graph.root, b.graph, b.graph.root);
  if (!diff.empty()) Fail("the written pickle differs: {}", diff);
  if (a.tensors.size() != b.tensors.size()) {
    Fail("{} tensors written, {} expected", b.tensors.size(), a.tensors.size());
  }
  for (size_t j = 0; j < a.tensors.size(); ++j) {
    const torch::Tensor& x = a.tensors[j];
    const torch::Tensor& y = b.tensors[j];
    const std::vector<int64_t>& stride =
        plan_.tensor_stride.empty() || plan_.tensor_stride[j].empty() ? x.stride
                                                                      : plan_.tensor_stride[j];
    const OutStorage* os = x.storage >= 0 ? &plan_.storages[plan_.tensor_storage[j]] : nullptr;
    torch::DType dtype = x.dtype;
    if (os != nullptr && os->convert) {
      dtype = os->to == kernels::Half::kBFloat16 ? torch::DType::kBFloat16 : torch::DType::kFloat16;
    }
    if (x.names != y.names || dtype != y.dtype || x.shape != y.shape || stride != y.stride ||
        x.requires_grad != y.requires_grad || x.kind != y.kind) {
      Fail("tensor '{}' changed", x.names.empty() ? "" : x.names[0]);
    }
    if (x.storage < 0) continue;
    const OutStorage& s = plan_.storages[plan_.tensor_storage[j]];
    if (b.storages[y.storage].key != s.key)
      Fail("tensor '{}' points at the wrong storage", x.names[0]);
    if (s.gather_tensor >= 0) {
      if (y.byte_begin != 0) Fail("gathered tensor '{}' does not start its storage", x.names[0]);
    } else if (s.convert) {
      if (x.numel > 0 && y.byte_begin * 2 + s.begin != x.byte_begin) {
        Fail("tensor '{}' moved inside its storage", x.names[0]);
      }
    } else if (x.numel > 0 && y.byte_begin + s.begin != x.byte_begin) {
      Fail("tensor '{}' moved inside its storage", x.names[0]);
    }
  }
  // Every record's bytes hash to the CRC written for it, and those CRCs came from the input's
  // bytes (or the input's own CRC for records copied whole): the data is the input's data.
  const auto& entries = o.archive->entries();
  std::vector<uint64_t> sizes;
  for (const zip::Entry& e : entries) sizes.push_back(e.size);
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        MappedFile::Window window(out, entries[i].data_offset + off, len);
        return Crc32(0, window.bytes());
      });
  for (size_t i = 0; i < entries.size(); ++i) {
    if (crcs[i] != entries[i].crc32) {
      Fail(
          "record '{}' does not match the input's checksum (is the input corrupt? run "
          "ckptool verify on it)",
          entries[i].name);
    }
  }
}

uint32_t TorchRewrite::WriteGathered(const OutStorage& s, AtomicOutput& out, uint64_t dst) const {
  uint32_t crc = 0;
  uint64_t written = 0;
  StreamTensorBytes(in_.map, *in_.torch, in_.torch->model.tensors[s.gather_tensor],
                    [&](Bytes piece) {
                      crc = Crc32(crc, piece);
                      out.Write(dst + written, piece);
                      written += piece.size();
                    });
  if (written != s.size()) Fail("internal: gathered {} bytes, planned {}", written, s.size());
  return crc;
}

uint32_t TorchRewrite::WritePiece(size_t storage, Bytes src, AtomicOutput& out, uint64_t dst) {
  const OutStorage& s = plan_.storages[storage];
  uint64_t overflow = 0;
  uint32_t crc =
      ckpt::WritePiece(out, dst, src, s.convert ? std::optional(s.to) : std::nullopt, &overflow);
  if (overflow) {
    std::lock_guard<std::mutex> lock(overflow_mutex_);
    overflow_[storage] += overflow;
  }
  return crc;
}

void CheckRewritable(const CheckpointFile& f, bool allow_unsafe_globals) {
  const torch::Model& m = f.torch->model;
  if (!m.problems.empty()) {
    Fail("{}: {}: {} (run ckptool verify); not rewriting a damaged file", f.path,
         m.problems[0].where, m.problems[0].what);
  }
  if (!m.notes.empty())
    Fail("{}: {}; not rewriting what ckptool does not fully understand", f.path, m.notes[0]);
  if (allow_unsafe_globals) return;
  std::vector<torch::UnsafeFinding> unsafe = torch::FindUnsafe(m.graph);
  if (!unsafe.empty()) {
    Fail(
        "{}: the pickle {}, which can run code when loaded; not rewriting it "
        "(--allow-unsafe-globals overrides)",
        f.path, unsafe[0].what);
  }
}

void CopyUnchanged(const CheckpointFile& f, const std::string& dest) {
  AtomicOutput out = AtomicOutput::Create(dest, f.map.size());
  out.RequireUnchanged(f.map);
  out.CopyFrom(f.map.fd(), 0, 0, f.map.size());
  out.SetMode(f.map.mode(), f.map.uid(), f.map.gid());
  out.Commit();
}

}  // namespace ckpt
