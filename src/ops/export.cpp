#include "ops/export.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>

#include "base/error.h"
#include "base/names.h"
#include "base/perf.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "ops/checkpoint_file.h"
#include "ops/piece_writer.h"
#include "ops/tensor_bytes.h"
#include "safetensors/safetensors_writer.h"
#include "torch/global_policy.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// One tensor to write: where it comes from and what it becomes.
struct ExportedTensor {
  size_t file = 0;
  size_t tensor = 0;
  std::string name;   // kept name
  std::string dtype;  // safetensors dtype written
  bool convert = false;
  uint64_t size = 0;  // bytes written
  uint32_t crc = 0;
};

std::vector<std::string> SourceFiles(const std::vector<std::string>& sources) {
  std::vector<std::string> files;
  for (const std::string& s : sources) {
    if (!fs::is_directory(s)) {
      files.push_back(s);
      continue;
    }
    std::vector<std::string> found;
    for (const auto& e : fs::directory_iterator(s)) {
      if (!e.is_regular_file()) continue;
      MappedFile m = MappedFile::Open(e.path().string());
      auto f = DetectFormat(m.bytes());
      if (f && *f != Format::kSafetensors) found.push_back(e.path().string());
    }
    std::sort(found.begin(), found.end());
    if (found.empty()) Fail("{}: no torch checkpoints in this folder", s);
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

bool UnderPrefix(const std::string& name, const std::string& prefix) {
  return prefix.empty() || IsBelowKeyPath(name, prefix);
}

std::string Relative(const std::string& name, const std::string& prefix) {
  return prefix.empty() ? name : name.substr(prefix.size() + 1);
}

std::string ChooseSelection(const torch::Model& m, const std::string& requested) {
  auto has = [&](const std::string& prefix) {
    for (const torch::Tensor& t : m.tensors) {
      for (const std::string& n : t.names) {
        if (UnderPrefix(n, prefix)) return true;
      }
    }
    return false;
  };
  if (!requested.empty()) {
    if (!has(requested)) Fail("--select {}: no tensors under that path", requested);
    return requested;
  }
  for (const char* candidate : {"state_dict", "module", "model_state_dict", "model"}) {
    if (has(candidate)) return candidate;
  }
  return "";
}

void WriteShard(const std::string& path, std::vector<ExportedTensor>& items,
                const std::map<std::string, std::string>& meta,
                const std::vector<std::unique_ptr<CheckpointFile>>& files, const ExportOptions& o) {
  std::stable_sort(
      items.begin(), items.end(), [](const ExportedTensor& a, const ExportedTensor& b) {
        uint32_t x = safetensors::DTypeBits(a.dtype), y = safetensors::DTypeBits(b.dtype);
        return x != y ? x > y : a.name < b.name;
      });
  std::vector<safetensors::OutTensor> outs;
  for (const ExportedTensor& it : items) {
    const torch::Tensor& t = files[it.file]->torch->model.tensors[it.tensor];
    outs.push_back({it.name, it.dtype, t.shape, it.size});
  }
  safetensors::Layout layout = safetensors::LayOut(outs, meta);
  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(path, layout.total_size);
  for (const auto& f : files) out.RequireUnchanged(f->map);
  out.Write(0, AsBytes(layout.header));
  std::vector<uint64_t> sizes;
  for (const ExportedTensor& it : items) {
    const torch::Tensor& t = files[it.file]->torch->model.tensors[it.tensor];
    sizes.push_back(IsContiguous(t) ? it.size : WholeRange(it.size));  // strided: one piece
  }
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, o.threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        const ExportedTensor& it = items[i];
        const CheckpointFile& f = *files[it.file];
        const torch::Tensor& t = f.torch->model.tensors[it.tensor];
        std::optional<kernels::Half> to = it.convert ? o.to : std::nullopt;
        uint64_t scale = it.convert ? 2 : 1;
        if (IsContiguous(t)) {
          const torch::Storage& s = f.torch->model.storages[t.storage];
          if (!s.present || s.compressed)
            Fail("tensor '{}': its storage record is compressed or missing", it.name);
          MappedFile::Window w(f.map, s.data_offset + t.byte_begin + off * scale, len * scale);
          return WritePiece(out, layout.offsets[i] + off, w.bytes(), to, nullptr);
        }
        uint32_t crc = 0;
        uint64_t written = 0;
        StreamTensorBytes(f.map, *f.torch, t, [&](Bytes piece) {
          uint32_t c = WritePiece(out, layout.offsets[i] + written, piece, to, nullptr);
          uint64_t n = piece.size() / scale;
          crc = written ? Crc32Combine(crc, c, n) : c;
          written += n;
        });
        return crc;
      });
  out.SetDefaultMode();
  out.Sync();
  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was written", path), [&] {
    PerfTimer verify("verify");
    safetensors::File back = safetensors::Parse(written.bytes());
    std::map<std::string, const safetensors::TensorEntry*> by_name;
    for (const auto& e : back.tensors) by_name[e.name] = &e;
    if (by_name.size() != items.size()) Fail("tensor count differs");
    for (size_t i = 0; i < items.size(); ++i) {
      auto e = by_name.find(items[i].name);
      if (e == by_name.end() || e->second->dtype != items[i].dtype)
        Fail("tensor '{}' is missing", items[i].name);
      MappedFile::Window w(written, back.data_offset + e->second->begin,
                           e->second->end - e->second->begin);
      if (Crc32(0, w.bytes()) != crcs[i])
        Fail("tensor '{}' does not hold the bytes written", items[i].name);
    }
  });
  out.Commit();
}

}  // namespace

ExportResult Export(const std::vector<std::string>& sources, const std::string& to,
                    const ExportOptions& o) {
  ExportResult r;
  std::vector<std::unique_ptr<CheckpointFile>> files;
  for (const std::string& path : SourceFiles(sources)) {
    auto f = std::make_unique<CheckpointFile>(OpenCheckpoint(path));
    if (!f->torch) Fail("{}: already safetensors (use ckptool convert to change dtypes)", path);
    const torch::Model& m = f->torch->model;
    if (!m.problems.empty())
      Fail("{}: {}: {} (run ckptool verify)", path, m.problems[0].where, m.problems[0].what);
    for (const torch::UnsafeFinding& u : torch::FindUnsafe(m.graph)) {
      r.warnings.push_back(
          fmt::format("{}: the pickle {} (never run; left behind by export)", path, u.what));
    }
    files.push_back(std::move(f));
  }
  r.selected = ChooseSelection(files[0]->torch->model, o.select);

  // Group identical views; every group is written once under its first name in sort order.
  std::vector<ExportedTensor> items;
  std::map<std::string, std::string> aliases;  // alias -> kept
  std::set<std::string> used_names;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const torch::Model& m = files[fi]->torch->model;
    std::map<std::tuple<int32_t, uint64_t, int, std::vector<int64_t>, std::vector<int64_t>>, size_t>
        groups;
    for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
      const torch::Tensor& t = m.tensors[ti];
      std::vector<std::string> names;
      for (const std::string& n : t.names) {
        if (UnderPrefix(n, r.selected)) names.push_back(Relative(n, r.selected));
      }
      if (names.empty()) continue;
      std::sort(names.begin(), names.end());
      const std::string& shown = names[0];
      if (t.storage < 0) Fail("tensor '{}' ({}) has no data to export", shown, t.kind);
      if (t.kind == "qtensor" || t.kind.starts_with("sparse") || t.kind.starts_with("nested")) {
        Fail("tensor '{}' is {}; safetensors cannot hold it", shown, t.kind);
      }
      std::string_view st_dtype = torch::Info(t.dtype).safetensors;
      if (st_dtype.empty())
        Fail("tensor '{}': safetensors has no {} dtype", shown, torch::Name(t.dtype));
      auto key =
          std::make_tuple(t.storage, t.byte_begin, static_cast<int>(t.dtype), t.shape, t.stride);
      auto [g, fresh] = groups.emplace(key, items.size());
      if (fresh) {
        ExportedTensor it;
        it.file = fi;
        it.tensor = ti;
        it.name = shown;
        it.dtype = std::string(st_dtype);
        it.size = t.numel * torch::ElementSize(t.dtype);
        if (o.to && t.dtype == torch::DType::kFloat32) {
          it.convert = true;
          it.dtype = *o.to == kernels::Half::kBFloat16 ? "BF16" : "F16";
          it.size /= 2;
        }
        items.push_back(it);
      }
      ExportedTensor& kept = items[g->second];
      for (const std::string& n : names) {
        if (n < kept.name) {  // a smaller name takes over; the old one becomes an alias
          aliases[kept.name] = n;
          kept.name = n;
        }
        if (n != kept.name) aliases[n] = kept.name;
      }
    }
  }
  for (auto& [alias, kept] : aliases) {  // resolve chains left by takeovers
    while (aliases.count(kept)) kept = aliases[kept];
  }
  for (const ExportedTensor& it : items) {
    if (!used_names.insert(it.name).second)
      Fail("two different tensors are both named '{}'", it.name);
  }
  if (items.empty()) Fail("no tensors to export");

  // Shards, in order, as Hugging Face splits them.
  std::vector<std::vector<ExportedTensor>> shards(1);
  uint64_t current = 0;
  for (const ExportedTensor& it : items) {
    if (o.max_shard_size && !shards.back().empty() && current + it.size > o.max_shard_size) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(it);
    current += it.size;
  }
  bool single_file = to.ends_with(".safetensors");
  fs::path dir = single_file ? fs::path(to).parent_path() : fs::path(to);
  std::string stem = single_file ? fs::path(to).stem().string() : "model";
  if (!dir.empty()) fs::create_directories(dir);
  std::map<std::string, std::string> weight_map;
  uint64_t total = 0;
  for (size_t si = 0; si < shards.size(); ++si) {
    std::string name = shards.size() == 1 ? stem + ".safetensors"
                                          : fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem,
                                                        si + 1, shards.size());
    std::map<std::string, std::string> meta;
    for (const ExportedTensor& it : shards[si]) {
      weight_map[it.name] = name;
      total += it.size;
    }
    for (const auto& [alias, kept] : aliases) {
      if (weight_map.count(kept) && weight_map[kept] == name) meta[alias] = kept;
    }
    std::string path = (dir / name).string();
    WriteShard(path, shards[si], meta, files, o);
    r.files.push_back(path);
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total}};
    index["weight_map"] = nlohmann::ordered_json(weight_map);
    std::string text =
        index.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::string path = (dir / (stem + ".safetensors.index.json")).string();
    AtomicOutput out = AtomicOutput::Create(path, text.size());
    out.Write(0, AsBytes(text));
    out.Commit();
    r.files.push_back(path);
  }
  r.tensors = items.size();
  r.aliases = aliases.size();
  r.bytes = total;
  return r;
}

}  // namespace ckpt
