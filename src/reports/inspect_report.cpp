#include "reports/inspect_report.h"

#include <algorithm>
#include <unordered_map>

#include "base/checked.h"

namespace ckpt {

namespace {

const char* kUsed = "tensor data (used)";
const char* kUnused = "tensor data (unused)";
const char* kCompressed = "tensor data (compressed)";

// Size of the union of [begin, end) ranges.
uint64_t UnionSize(std::vector<std::pair<uint64_t, uint64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  uint64_t total = 0, cur_begin = 0, cur_end = 0;
  bool open = false;
  for (auto [b, e] : ranges) {
    if (b >= e) continue;
    if (open && b <= cur_end) {
      cur_end = std::max(cur_end, e);
      continue;
    }
    if (open) total += cur_end - cur_begin;
    cur_begin = b;
    cur_end = e;
    open = true;
  }
  if (open) total += cur_end - cur_begin;
  return total;
}

void AddBytes(FileReport& r, const std::string& label, uint64_t bytes) {
  if (bytes == 0) return;
  for (auto& [l, b] : r.byte_map) {
    if (l == label) {
      b += bytes;
      return;
    }
  }
  r.byte_map.emplace_back(label, bytes);
}

// The `keep` largest rows, ties in the order they were added (what the text report lists).
void PruneRows(std::vector<TensorRow>& rows, size_t keep) {
  if (rows.size() <= keep) return;
  std::stable_sort(rows.begin(), rows.end(),
                   [](const TensorRow& a, const TensorRow& b) { return a.bytes > b.bytes; });
  rows.resize(keep);
}

// Rows kept under a limit: the largest so far, and what a row must exceed to be kept (once
// `keep` rows came before it with at least its size, it cannot be among the largest).
struct RowKeeper {
  size_t keep = SIZE_MAX;
  uint64_t must_exceed = 0;
  bool full = false;
  // Is a row of this size worth building?
  bool Wanted(uint64_t bytes) const { return !full || bytes > must_exceed; }
};

void AddRow(FileReport& r, TensorRow&& row, RowKeeper& k) {
  r.tensors.push_back(std::move(row));
  // Pruned in batches: amortized O(log keep) per row.
  if (k.keep != SIZE_MAX && r.tensors.size() >= 2 * k.keep + 64) {
    PruneRows(r.tensors, k.keep);
    k.full = true;
    k.must_exceed = r.tensors.empty() ? UINT64_MAX : r.tensors.back().bytes;
  }
}

// The rows of a rollup, found by key in constant time.
class RollupIndex {
 public:
  explicit RollupIndex(std::vector<Rollup>& rows) : rows_(rows) {}
  Rollup& operator[](const std::string& key) {
    auto [it, inserted] = index_.try_emplace(key, rows_.size());
    if (inserted) rows_.push_back(Rollup{key});
    return rows_[it->second];
  }

 private:
  std::vector<Rollup>& rows_;
  std::unordered_map<std::string, size_t> index_;
};

void FinishByteMap(FileReport& r) {
  uint64_t mapped = 0;
  for (auto& [l, b] : r.byte_map) mapped += b;
  if (mapped < r.file_bytes) AddBytes(r, "unmapped", r.file_bytes - mapped);
  std::stable_sort(r.byte_map.begin(), r.byte_map.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
}

// `release`: the graph to free once it has been read (the file's own, or null).
void FromTorch(const CheckpointFile& f, FileReport& r, RowKeeper& keeper, pickle::Graph* release,
               const torch::Trust& trust) {
  size_t keep = keeper.keep;
  const torch::TorchFile& tf = *f.torch;
  const torch::Model& m = tf.model;
  RollupIndex by_dtype(r.by_dtype), by_key(r.by_key);
  r.pickle_protocol = m.graph.protocol;
  torch::PickleScan scan = torch::ScanPickle(m.graph, trust);
  for (torch::ImportedName& n : scan.names) {
    r.globals.push_back({std::move(n.name), std::move(n.raw), n.cls, n.getattr, n.verdict});
  }
  for (const torch::UnsafeFinding& u : scan.findings) {
    if (m.graph.kind(u.node) == pickle::Kind::kObject) {
      r.unsafe_calls.push_back({m.graph.at(u.node).stream_offset, u.what});
    }
  }
  if (release) *release = pickle::Graph();
  r.problems = m.problems;
  r.notes = m.notes;
  for (const torch::Region& reg : tf.regions) AddBytes(r, reg.label, reg.size);

  // Per storage: the byte ranges its views reach.
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> ranges(m.storages.size());
  std::vector<uint32_t> views(m.storages.size(), 0);
  std::vector<std::string> storage_top(m.storages.size());
  std::vector<bool> has_top(m.storages.size(), false);
  size_t rows = 0;
  for (const torch::Tensor& t : m.tensors) rows += t.names.size();
  r.tensors.reserve(keep == SIZE_MAX ? rows : std::min(rows, 2 * keep + 64));
  for (const torch::Tensor& t : m.tensors) {
    uint64_t es = torch::ElementSize(t.dtype);
    uint64_t bytes = CheckedMul(t.numel, es);
    r.tensor_bytes += bytes;
    r.distinct_tensors++;
    Rollup& d = by_dtype[std::string(torch::Name(t.dtype))];
    d.tensors++;
    d.tensor_bytes += bytes;
    Rollup& k = by_key[std::string(t.top_key())];
    k.tensors++;
    k.tensor_bytes += bytes;
    if (t.storage >= 0) {
      ranges[t.storage].emplace_back(t.byte_begin, t.byte_end);
      views[t.storage]++;
      if (!has_top[t.storage]) {
        storage_top[t.storage] = t.top_key();
        has_top[t.storage] = true;
      }
    }
    for (std::string_view name : t.names) {
      r.tensor_names++;
      if (!keeper.Wanted(bytes)) continue;
      TensorRow row;
      row.name = name;
      row.dtype = std::string(torch::Name(t.dtype));
      row.kind = t.kind;
      row.shape = t.shape;
      row.stride = t.stride;
      row.storage = t.storage >= 0 ? m.storages[t.storage].key : "";
      row.offset = static_cast<uint64_t>(t.offset);
      row.bytes = bytes;
      row.requires_grad = t.requires_grad;
      AddRow(r, std::move(row), keeper);
    }
  }
  const zip::Archive* archive = tf.archive ? &*tf.archive : nullptr;
  for (size_t i = 0; i < m.storages.size(); ++i) {
    const torch::Storage& s = m.storages[i];
    StorageRow row;
    row.key = s.key;
    row.dtype = std::string(torch::Name(s.dtype));
    row.location = s.location;
    row.bytes = s.nbytes;
    row.used_bytes = s.used_whole ? s.nbytes : std::min(UnionSize(ranges[i]), s.nbytes);
    row.views = views[i];
    row.compressed = s.compressed;
    r.storage_bytes += row.bytes;
    r.used_bytes += row.used_bytes;
    // On-disk bytes: the record (zip) or the declared size (legacy).
    if (s.present) {
      uint64_t on_disk = s.nbytes;
      if (archive) {
        const zip::Entry* e = &archive->entries()[s.entry];
        on_disk = e->compressed_size;
        if (!s.compressed) {
          uint64_t used = std::min(row.used_bytes, e->size);
          AddBytes(r, kUsed, used);
          AddBytes(r, kUnused, on_disk - used);
        } else {
          AddBytes(r, kCompressed, on_disk);
        }
      } else {
        AddBytes(r, kUsed, row.used_bytes);
        AddBytes(r, kUnused, s.nbytes - row.used_bytes);
      }
    }
    Rollup& d = by_dtype[row.dtype];
    d.storages++;
    d.storage_bytes += row.bytes;
    d.used_bytes += row.used_bytes;
    Rollup& k = by_key[storage_top[i]];
    k.storages++;
    k.storage_bytes += row.bytes;
    k.used_bytes += row.used_bytes;
    r.storage_count++;
    if (row.views > 1) r.shared_storages++;
    if (keep == SIZE_MAX) r.storages.push_back(std::move(row));
  }
}

void FromSafetensors(const CheckpointFile& f, FileReport& r, RowKeeper& keeper) {
  const safetensors::File& st = *f.st;
  RollupIndex by_dtype(r.by_dtype), by_key(r.by_key);
  r.metadata = st.metadata;
  AddBytes(r, "safetensors header", st.data_offset);
  for (const safetensors::TensorEntry& e : st.tensors) {
    uint64_t bytes = e.end - e.begin;
    r.tensor_names++;
    if (keeper.Wanted(bytes)) {
      TensorRow row;
      row.name = e.name;
      row.dtype = e.torch_dtype;
      row.kind = "tensor";
      // The shape torch loads it as (F4: float4_e2m1fn_x2, half as many elements).
      std::optional<torch::DType> dt = torch::FromSafetensors(e.dtype);
      std::optional<std::vector<int64_t>> shape =
          dt ? torch::TorchShape(*dt, e.shape) : std::nullopt;
      row.shape = shape ? *shape : e.shape;
      row.stride.assign(row.shape.size(), 1);
      for (size_t i = row.shape.size(); i-- > 1;)
        row.stride[i - 1] = row.stride[i] * std::max<int64_t>(row.shape[i], 1);
      row.storage = e.name;
      row.bytes = bytes;
      AddRow(r, std::move(row), keeper);
    }
    StorageRow s;
    s.key = e.name;
    s.dtype = e.torch_dtype;
    s.location = "cpu";
    s.bytes = s.used_bytes = bytes;
    s.views = 1;
    r.storage_count++;
    if (keeper.keep == SIZE_MAX) r.storages.push_back(s);
    r.tensor_bytes += bytes;
    r.distinct_tensors++;
    r.storage_bytes += bytes;
    r.used_bytes += bytes;
    AddBytes(r, kUsed, bytes);
    std::string top = e.name.substr(0, e.name.find('.'));
    for (Rollup* roll : {&by_dtype[e.torch_dtype], &by_key[top]}) {
      roll->tensors++;
      roll->tensor_bytes += bytes;
      roll->storages++;
      roll->storage_bytes += bytes;
      roll->used_bytes += bytes;
    }
  }
}

FileReport Build(const CheckpointFile& f, size_t keep_rows, pickle::Graph* release,
                 const torch::Trust& trust) {
  FileReport r;
  r.path = f.path;
  r.format = f.format;
  r.file_bytes = f.map.size();
  RowKeeper keeper;
  keeper.keep = keep_rows;
  if (f.torch) FromTorch(f, r, keeper, release, trust);
  if (f.st) FromSafetensors(f, r, keeper);
  if (keep_rows != SIZE_MAX) PruneRows(r.tensors, keep_rows);
  r.wasted_bytes = r.storage_bytes - r.used_bytes;
  FinishByteMap(r);
  uint64_t data = 0;
  for (auto& [label, bytes] : r.byte_map) {
    if (label == kUsed || label == kUnused || label == kCompressed) data += bytes;
  }
  r.metadata_bytes = r.file_bytes - data;
  auto by_bytes = [](const Rollup& a, const Rollup& b) {
    return a.storage_bytes != b.storage_bytes ? a.storage_bytes > b.storage_bytes : a.key < b.key;
  };
  std::sort(r.by_dtype.begin(), r.by_dtype.end(), by_bytes);
  std::sort(r.by_key.begin(), r.by_key.end(), by_bytes);
  return r;
}

}  // namespace

FileReport BuildReport(const CheckpointFile& f, size_t keep_rows, const torch::Trust& trust) {
  return Build(f, keep_rows, nullptr, trust);
}

FileReport BuildReport(CheckpointFile&& f, size_t keep_rows, const torch::Trust& trust) {
  return Build(f, keep_rows, f.torch ? &f.torch->model.graph : nullptr, trust);
}

}  // namespace ckpt
