#include "rewriters/torch_rewrite.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "base/error.h"
#include "base/perf.h"
#include "io/atomic_output.h"
#include "io/checked_ranges.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "pickle/writer.h"

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
  outputs_.assign(plan_.storages.size(), {});
  for (size_t i = 0; i < plan_.storages.size(); ++i) {
    const PlannedStorage& s = plan_.storages[i];
    StorageOutput& o = outputs_[i];
    const torch::Storage& src = m.storages[s.source];
    NodeId old_pid = g.compound(src.first_ref).args;
    NodeId cls = g.items(old_pid)[1];
    uint64_t out_es = torch::ElementSize(src.dtype);
    if (s.convert) {
      if (src.dtype == torch::DType::kFloat32) {
        cls = g.AddGlobal("torch", torch::Info(torch::DTypeOf(s.to)).storage_class);
        out_es = 2;
      } else if (src.dtype != torch::DType::kUntyped) {
        Fail("internal: converting a {} storage", torch::Name(src.dtype));
      }
    }
    NodeId location = g.items(old_pid)[3];
    if (s.end < s.begin || s.size() % out_es != 0 || s.end > src.nbytes) {
      Fail("internal: bad output range [{}, {}) of storage '{}'", s.begin, s.end, src.key);
    }
    o.key_node = g.AddText(Kind::kStr, "");
    NodeId numel = g.AddInt(static_cast<int64_t>(s.size() / out_es));
    NodeId pid = g.AddTuple({tag, cls, o.key_node, location, numel});
    o.persid = g.AddPersId(pid);
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
    const PlannedStorage& os = plan_.storages[plan_.tensor_storage[j]];
    // _rebuild_tensor_v3 over an UntypedStorage names the dtype itself (argument 6).
    NodeId dtype = pickle::kNil;
    if (os.convert && m.storages[t.storage].dtype == torch::DType::kUntyped) {
      dtype = g.AddGlobal("torch", kernels::TorchName(os.to));
    }
    g.SetItem(t.args, 0, outputs_[plan_.tensor_storage[j]].persid);
    g.SetItem(t.args, 1, offset);
    if (stride != pickle::kNil) g.SetItem(t.args, 3, stride);
    if (dtype != pickle::kNil) {
      if (g.items(t.args).size() < 7)
        Fail("internal: tensor '{}' has no dtype argument", t.names[0]);
      g.SetItem(t.args, 6, dtype);
    }
  }
  for (size_t k = 0; k < m.bare_refs.size(); ++k) {
    NodeId pid = g.compound(outputs_[plan_.bare_storage[k]].persid).args;
    g.mutable_compound(m.bare_refs[k].first).args = pid;
  }
  ReleaseTensorRows();
}

void TorchRewrite::SerializePickle() {
  torch::Model& m = in_.torch->model;
  pickle::Graph& g = m.graph;
  std::unordered_map<NodeId, int32_t> owner;
  for (size_t i = 0; i < outputs_.size(); ++i) owner[outputs_[i].persid] = static_cast<int32_t>(i);
  for (size_t k = 0; k < m.bare_refs.size(); ++k)
    owner[m.bare_refs[k].first] = plan_.bare_storage[k];
  int next = 0;
  pickle::WriteOptions o;
  o.protocol = std::max(2, g.protocol);
  // Rewritten keys and offsets rarely change the size by more than a few percent.
  o.reserve = in_.torch->pickle_size + in_.torch->pickle_size / 8 + 4096;
  o.before_persid = [&](NodeId p) {
    auto it = owner.find(p);
    if (it == owner.end()) {
      Fail(
          "the pickle refers to a storage at offset {} that ckptool cannot map; refusing to "
          "rewrite",
          g.at(p).stream_offset);
    }
    StorageOutput& s = outputs_[it->second];
    if (s.key.empty()) {
      s.key = std::to_string(next++);
      g.SetText(s.key_node, s.key);
    }
  };
  pickle_ = pickle::Write(g, g.root, o);
  digest_ = pickle::DigestGraph(g, g.root);
  m.graph.Release();
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
  size_t count = before.size() + after.size() + 1 + outputs_.size();  // at most
  specs.reserve(count);
  records_.reserve(count);
  auto add_small = [&](const std::string& name, std::string bytes) {
    specs.push_back({prefix + "/" + name, bytes.size()});
    records_.push_back({std::move(bytes), -1});
  };
  add_small("data.pkl", std::move(pickle_));
  for (auto& [name, bytes] : before) add_small(name, std::move(bytes));
  std::vector<int32_t> by_key;
  for (size_t i = 0; i < outputs_.size(); ++i) {
    if (!outputs_[i].key.empty()) by_key.push_back(static_cast<int32_t>(i));
  }
  std::sort(by_key.begin(), by_key.end(), [&](int32_t a, int32_t b) {
    return std::stoull(outputs_[a].key) < std::stoull(outputs_[b].key);
  });
  for (int32_t i : by_key) {
    specs.push_back({prefix + "/data/" + outputs_[i].key, plan_.storages[i].size()});
    records_.push_back({"", i});
  }
  for (auto& [name, bytes] : after) add_small(name, std::move(bytes));
  zip_ = zip::ZipPlan::Layout(specs, alignment);
  output_size_ = zip_.total_size();
}

bool TorchRewrite::SourceIsStored(const PlannedStorage& s, uint64_t* file_offset) const {
  const torch::Storage& src = in_.torch->model.storages[s.source];
  if (src.compressed) return false;
  *file_offset = src.data_offset + s.begin;
  return true;
}

void TorchRewrite::Write(const std::string& final_path, unsigned threads,
                         const WriteProgress& progress) {
  const torch::TorchFile& tf = *in_.torch;
  uint64_t total = zip_.total_size();
  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(final_path, total);
  out.RequireUnchanged(in_.map);
  const auto& placed = zip_.records();
  std::vector<uint32_t> crcs(records_.size(), 0);
  std::vector<uint64_t> sizes(records_.size(), 0);
  std::vector<bool> reuse(records_.size(), false);
  // A storage record's header is written with its first piece; runs of small records are
  // written whole (header, data, descriptor) by one job each, staged in memory.
  std::vector<uint64_t> span(records_.size(), 0);
  std::vector<bool> small(records_.size(), false);
  std::vector<char> in_run(records_.size(), 0);
  for (size_t i = 0; i < records_.size(); ++i) {
    uint64_t next = i + 1 < records_.size() ? placed[i + 1].header_offset : zip_.directory_offset();
    span[i] = next - placed[i].header_offset;
    const Record& r = records_[i];
    if (r.storage < 0) {
      out.Write(placed[i].header_offset, AsBytes(zip_.LocalHeader(i)));
      out.Write(placed[i].data_offset, AsBytes(r.data));
      crcs[i] = Crc32(0, AsBytes(r.data));
      // Written: the pickle (many MiB for 10^5 tensors) need not be held while the file is
      // read back and verified.
      std::string().swap(records_[i].data);
      continue;
    }
    const PlannedStorage& s = plan_.storages[r.storage];
    const torch::Storage& src = tf.model.storages[s.source];
    small[i] = s.size() < kSmallRange;
    uint64_t offset;
    if (!SourceIsStored(s, &offset) || s.gather_tensor >= 0) {
      sizes[i] = WholeRange(s.size());  // the inflated stream or the gather
      continue;
    }
    sizes[i] = s.size();
    if (tf.archive && s.begin == 0 && !s.convert) {
      const zip::Entry* e = src.entry >= 0 ? &tf.archive->entries()[src.entry] : nullptr;
      if (e != nullptr && e->size == s.end) {
        reuse[i] = true;
        crcs[i] = e->crc32;
      }
    }
  }

  overflow_.assign(plan_.storages.size(), 0);
  // Pieces are in output coordinates; a converted storage reads twice as many input bytes.
  auto write_piece = [&](size_t i, uint64_t off, uint64_t len) -> uint32_t {
    if (off == 0) out.Write(placed[i].header_offset, AsBytes(zip_.LocalHeader(i)));
    size_t si = static_cast<size_t>(records_[i].storage);
    const PlannedStorage& s = plan_.storages[si];
    uint64_t dst = placed[i].data_offset, src_offset;
    if (s.gather_tensor >= 0) {
      if (progress.bytes_done) *progress.bytes_done += s.size();
      return WriteGathered(s, out, dst);
    }
    if (!SourceIsStored(s, &src_offset)) return WriteInflated(si, out, dst, progress);
    if (progress.bytes_done) *progress.bytes_done += s.convert ? 2 * len : len;
    return WriteStored(si, off, len, reuse[i], out, dst);
  };
  // Pieces written through memory are read back as they land (io/checked_ranges.h): a
  // record whose every piece was needs no re-read in Verify.
  CheckedRanges checked(records_.size());
  auto checked_piece = [&](size_t i, uint64_t off, uint64_t len) {
    return checked.Write(out, i, [&] { return write_piece(i, off, len); });
  };
  std::vector<uint32_t> data_crcs = ParallelCrcInRuns(
      sizes, span, small, threads, checked_piece,
      [&](size_t first, size_t end, uint32_t* run_crcs) {
        uint64_t begin = placed[first].header_offset;
        AtomicOutput::Staged staged(out, begin,
                                    placed[end - 1].header_offset + span[end - 1] - begin);
        // The input bytes of the run, read in one go when they lie close together.
        std::vector<FileRange> reads;
        for (size_t i = first; i < end; ++i) {
          const PlannedStorage& s = plan_.storages[records_[i].storage];
          uint64_t at;
          if (s.gather_tensor < 0 && SourceIsStored(s, &at))
            reads.push_back({at, s.convert ? 2 * s.size() : s.size()});
        }
        std::optional<MappedFile::Prefetched> prefetched;
        if (auto cover = CoveringRange(reads))
          prefetched.emplace(in_.map, cover->offset, cover->size);
        for (size_t i = first; i < end; ++i) {
          uint32_t crc = sizes[i] > 0 ? write_piece(i, 0, sizes[i]) : 0;
          if (sizes[i] == 0) out.Write(placed[i].header_offset, AsBytes(zip_.LocalHeader(i)));
          run_crcs[i] = reuse[i] ? crcs[i] : crc;
          out.Write(placed[i].descriptor_offset, AsBytes(zip_.Descriptor(i, run_crcs[i])));
          in_run[i] = 1;
        }
        staged.Flush();
      });
  for (size_t i = 0; i < records_.size(); ++i) {
    if (in_run[i]) {
      crcs[i] = data_crcs[i];
      continue;
    }
    if (records_[i].storage >= 0) {
      if (sizes[i] == 0) out.Write(placed[i].header_offset, AsBytes(zip_.LocalHeader(i)));
      if (!reuse[i]) crcs[i] = data_crcs[i];
    }
    out.Write(placed[i].descriptor_offset, AsBytes(zip_.Descriptor(i, crcs[i])));
  }
  out.Write(zip_.directory_offset(), AsBytes(zip_.DirectoryAndEnd(crcs)));
  checked_.clear();
  for (size_t i = 0; i < records_.size(); ++i) {
    if (checked.checked(i))
      checked_.push_back(
          {placed[i].data_offset, plan_.storages[records_[i].storage].size(), crcs[i]});
  }
  std::sort(
      checked_.begin(), checked_.end(),  // Verify looks records up by offset
      [](const CheckedRecord& a, const CheckedRecord& b) { return a.data_offset < b.data_offset; });
  out.SetMode(in_.map.mode(), in_.map.uid(), in_.map.gid());
  {
    PerfTimer sync("fsync");
    out.Sync();
  }
  // What the read-back is checked against is in expected_, names_ and outputs_: the layout
  // (a record name and offsets per storage) and the input's rows go first.
  zip_ = zip::ZipPlan();
  std::vector<Record>().swap(records_);
  ReleaseInputRows();
  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was replaced", in_.path),
              [&] {
                PerfTimer verify("verify");
                Verify(written, threads);
              });
  PerfTimer commit("rename and fsync folder");
  out.Commit();
}

}  // namespace ckpt
