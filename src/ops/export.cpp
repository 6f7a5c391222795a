#include "ops/export.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "base/perf.h"
#include "compress/archive.h"
#include "compress/skeleton.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/crc32.h"
#include "io/folders.h"
#include "io/parallel_crc.h"
#include "io/temp_files.h"
#include "ops/archive_view.h"
#include "ops/compress.h"
#include "ops/conversion_tally.h"
#include "ops/dcp_export.h"
#include "ops/discovery.h"
#include "ops/element_convert.h"
#include "ops/logical_export.h"
#include "ops/piece_writer.h"
#include "ops/safetensors_output.h"
#include "ops/training_state.h"
#include "ops/zero_export.h"
#include "torch/global_policy.h"
#include "torch/tensor_bytes.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// One tensor to write: where it comes from and what it becomes.
struct ExportedTensor {
  size_t file = 0;
  size_t tensor = 0;  // into the file's torch tensor table, or its safetensors entries
  std::string name;   // kept name
  torch::DType dtype = torch::DType::kFloat32;  // as written
  torch::DType from = torch::DType::kFloat32;   // as stored
  bool convert = false;
  uint64_t size = 0;  // bytes written
  uint32_t crc = 0;
};

std::vector<std::string> SourceFiles(const std::vector<std::string>& sources, bool all) {
  std::vector<std::string> files;
  for (const std::string& s : sources) {
    if (!fs::is_directory(s)) {
      files.push_back(s);
      continue;
    }
    std::vector<std::string> found = ModelFilesIn(s, all);
    files.insert(files.end(), found.begin(), found.end());
  }
  return files;
}

bool UnderPrefix(std::string_view name, const std::string& prefix) {
  return prefix.empty() || IsBelowKeyPath(name, prefix);
}

std::string Relative(std::string_view name, const std::string& prefix) {
  return std::string(prefix.empty() ? name : name.substr(prefix.size() + 1));
}

// --select, else the model's key in a training checkpoint (ModelKey), else everything.
std::string ChooseSelection(const std::vector<std::unique_ptr<CheckpointFile>>& files,
                            const std::string& requested, bool all) {
  auto has = [&](const std::string& prefix) {
    for (const auto& f : files) {
      if (f->st) {
        for (const safetensors::TensorEntry& e : f->st->tensors) {
          if (UnderPrefix(e.name, prefix)) return true;
        }
        continue;
      }
      for (const torch::Tensor& t : f->torch->model.tensors) {
        for (std::string_view n : t.names) {
          if (UnderPrefix(n, prefix)) return true;
        }
      }
    }
    return false;
  };
  if (!requested.empty()) {
    if (!has(requested)) Fail("--select {}: no tensors under that path", requested);
    return requested;
  }
  if (all || !files[0]->torch) return "";
  return ModelKey(files[0]->torch->model);
}

// Does --dtype convert a tensor stored as `d`? Every floating type one rounding makes the
// half type: float32, float16, bfloat16 (float64 would round twice); the same rule as the
// logical export's (ops/logical_export.cpp), whatever holds the model.
bool Converts(const ExportOptions& o, torch::DType d) {
  return o.to && torch::IsFloatingPoint(d) && d != torch::DTypeOf(*o.to) &&
         CanConvert(d, torch::DTypeOf(*o.to));
}

// Writes `src` (elements stored as `from`) at `dst`: through the float32 kernels
// (WritePiece) for float32, else through WriteConverted; `to` unset copies. Returns the CRC32
// of what was written.
uint32_t WriteElements(AtomicOutput& out, uint64_t dst, Bytes src, torch::DType from,
                       std::optional<kernels::Half> to, kernels::ConversionLoss* loss) {
  if (!to || from == torch::DType::kFloat32) return WritePiece(out, dst, src, to, nullptr, 0, loss);
  return WriteConverted(out, dst, src, from, torch::DTypeOf(*to), nullptr);
}

// WriteElements of [offset, offset + size) of `in`, through small windows (WriteRange for
// float32 and copies).
uint32_t WriteElementRange(AtomicOutput& out, uint64_t dst, const MappedFile& in, uint64_t offset,
                           uint64_t size, torch::DType from, std::optional<kernels::Half> to,
                           kernels::ConversionLoss* loss) {
  if (!to || from == torch::DType::kFloat32)
    return WriteRange(out, dst, in, offset, size, to, nullptr, loss);
  const uint64_t scale = torch::ElementSize(torch::DTypeOf(*to));
  const uint64_t in_size = torch::ElementSize(from);
  uint32_t crc = 0;
  uint64_t written = 0;
  StreamRange(in, offset, size, [&](uint64_t, Bytes window) {
    uint32_t c = WriteElements(out, dst + written, window, from, to, loss);
    uint64_t n = window.size() / in_size * scale;
    crc = written ? Crc32Combine(crc, c, n) : c;
    written += n;
  });
  return crc;
}

// A torch tensor as a safetensors source: contiguous ones are cut into parallel pieces;
// strided ones are gathered in one go.
TensorSource SourceOf(const ExportedTensor& it, size_t index, const CheckpointFile& f,
                      std::optional<kernels::Half> to, ConversionTally& tally) {
  std::optional<kernels::Half> convert = it.convert ? to : std::nullopt;
  // input bytes per output byte (2 from float32 to a half type)
  uint64_t scale = it.convert ? torch::ElementSize(it.from) / torch::ElementSize(it.dtype) : 1;
  const torch::DType from = it.from;
  if (f.st) {  // a safetensors tensor: one contiguous range
    const safetensors::TensorEntry& e = f.st->tensors[it.tensor];
    std::optional<std::vector<int64_t>> shape = torch::TorchShape(it.dtype, e.shape);
    if (!shape)
      Fail("tensor '{}': {} with an odd last dimension has no torch shape", e.name, e.dtype);
    TensorSource src{it.name, it.dtype, *shape, it.size, false, nullptr};
    uint64_t at = f.st->data_offset + e.begin;
    src.input = &f.map;
    src.input_range = {at, it.size * scale};
    src.write = [&f, at, convert, scale, from, index, &tally](AtomicOutput& out, uint64_t dst,
                                                              uint64_t off, uint64_t len) {
      kernels::ConversionLoss loss;
      uint32_t crc =
          WriteElementRange(out, dst, f.map, at + off * scale, len * scale, from, convert, &loss);
      if (convert) tally.Add(index, loss);
      return crc;
    };
    return src;
  }
  const torch::Tensor& t = f.torch->model.tensors[it.tensor];
  TensorSource src{it.name, it.dtype, t.shape, it.size, !IsContiguous(t), nullptr};
  std::string name = it.name;
  if (IsContiguous(t) && t.storage >= 0) {
    const torch::Storage& s = f.torch->model.storages[t.storage];
    if (s.present && !s.compressed) {
      src.input = &f.map;
      src.input_range = {s.data_offset + t.byte_begin, it.size * scale};
    }
  }
  src.write = [&f, &t, convert, scale, from, name, index, &tally](AtomicOutput& out, uint64_t dst,
                                                                  uint64_t off, uint64_t len) {
    kernels::ConversionLoss loss;
    uint32_t crc = 0;
    if (IsContiguous(t)) {
      const torch::Storage& s = f.torch->model.storages[t.storage];
      if (!s.present || s.compressed)
        Fail("tensor '{}': its storage record is compressed or missing", name);
      crc = WriteElementRange(out, dst, f.map, s.data_offset + t.byte_begin + off * scale,
                              len * scale, from, convert, &loss);
    } else {
      uint64_t written = 0;
      StreamTensorBytes(f.map, *f.torch, t, [&](Bytes piece) {
        uint32_t c = WriteElements(out, dst + written, piece, from, convert, &loss);
        uint64_t n = piece.size() / scale;
        crc = written ? Crc32Combine(crc, c, n) : c;
        written += n;
      });
    }
    if (convert) tally.Add(index, loss);
    return crc;
  };
  return src;
}

}  // namespace

namespace {

// A .ckz archive given to export is read in place (ops/archive_view.h), its skeleton in a
// temp folder beside the output -- the same file system -- and exported as the original
// would be, every tensor byte decoded from the archive's chunks as it is written and its
// chunk's CRC32 checked. The views are dropped and their temp folders removed whatever
// happens.
bool IsArchiveSource(const std::string& s) {
  std::error_code ec;
  return fs::is_regular_file(s, ec) && ckz::IsArchiveFile(s);
}

}  // namespace

ExportResult Export(const std::vector<std::string>& sources, const std::string& to,
                    const ExportOptions& o) {
  if (std::any_of(sources.begin(), sources.end(), IsArchiveSource)) {
    fs::path out = fs::absolute(to).lexically_normal();
    if (!out.has_filename()) out = out.parent_path();  // "out/"
    std::vector<std::unique_ptr<ArchiveView>> views;
    std::vector<std::string> opened;
    for (const std::string& s : sources) {
      if (!IsArchiveSource(s)) {
        opened.push_back(s);
        continue;
      }
      views.push_back(ArchiveView::Open(s, out.parent_path().string(), o.threads));
      opened.push_back(views.back()->root());
    }
    ExportResult r = Export(opened, to, o);
    for (const auto& v : views) {
      r.archive_plain_bytes += v->skeleton().plain_bytes();
      r.archive_backed_bytes += v->skeleton().backed_bytes();
    }
    return r;
  }
  if (sources.size() == 1 && deepspeed::LooksLikeZeroCheckpoint(sources[0]))
    return ExportZero(sources[0], to, o);
  if (sources.size() == 1 && dcp::LooksLikeDcpCheckpoint(sources[0]))
    return ExportDcp(sources[0], to, o);
  if (IsTorchOutputPath(to))
    Fail(
        "--to {}: a torch file is written from DeepSpeed ZeRO and torch.distributed.checkpoint "
        "folders; torch files are exported to safetensors (ckptool convert changes a torch "
        "file's dtypes)",
        to);
  if (!o.tag.empty() || o.exclude_frozen)
    Fail("--tag and --exclude-frozen apply to DeepSpeed ZeRO checkpoints");
  ExportResult r;
  std::vector<std::unique_ptr<CheckpointFile>> files;
  for (const std::string& path : SourceFiles(sources, o.all)) {
    auto f = std::make_unique<CheckpointFile>(OpenCheckpoint(path));
    if (!f->torch) {
      files.push_back(std::move(f));
      continue;
    }
    const torch::Model& m = f->torch->model;
    if (!m.problems.empty())
      Fail("{}: {}: {} (run ckptool verify)", path, m.problems[0].where, m.problems[0].what);
    for (const torch::UnsafeFinding& u : torch::FindUnsafe(m.graph)) {
      r.warnings.push_back(
          fmt::format("{}: the pickle {} (never run; left behind by export)", path, u.what));
    }
    files.push_back(std::move(f));
  }
  r.selected = ChooseSelection(files, o.select, o.all);

  // Group identical views; every group is written once under its first name in the source's
  // order (the pickle's), the other names recorded as aliases.
  std::vector<ExportedTensor> items;
  std::map<std::string, std::string> aliases;  // alias -> kept
  size_t all_tensors = 0;
  for (const auto& f : files)
    all_tensors += f->torch ? f->torch->model.tensors.size() : f->st->tensors.size();
  items.reserve(all_tensors);
  std::unordered_map<std::string, size_t> file_of;  // exported name -> file (shards are disjoint)
  auto claim = [&](const std::string& name, size_t fi) {
    auto [it, fresh] = file_of.try_emplace(name, fi);
    if (!fresh && it->second != fi) {
      Fail(
          "'{}' is in both {} and {}: these are separate checkpoints, not the shards of one "
          "model; export one of them",
          name, files[it->second]->path, files[fi]->path);
    }
  };
  // With no --select and no model key, the whole object is the model less its training state
  // (optimizer, scheduler, RNG: ops/training_state.h), unless --all asks for everything.
  bool drop_training = r.selected.empty() && o.select.empty() && !o.all;
  uint64_t left_out = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    if (files[fi]->st) {
      const safetensors::File& st = *files[fi]->st;
      for (size_t ti = 0; ti < st.tensors.size(); ++ti) {
        const safetensors::TensorEntry& e = st.tensors[ti];
        if (!UnderPrefix(e.name, r.selected)) continue;
        std::optional<torch::DType> dtype = torch::FromSafetensors(e.dtype);
        if (!dtype) Fail("tensor '{}': torch has no {} dtype", e.name, e.dtype);
        ExportedTensor it;
        it.file = fi;
        it.tensor = ti;
        it.name = Relative(e.name, r.selected);
        it.dtype = *dtype;
        it.size = e.end - e.begin;
        it.from = *dtype;
        if (Converts(o, *dtype)) {
          it.convert = true;
          it.dtype = torch::DTypeOf(*o.to);
          it.size = it.size / torch::ElementSize(*dtype) * torch::ElementSize(it.dtype);
        }
        claim(it.name, fi);
        items.push_back(it);
      }
      continue;
    }
    const torch::Model& m = files[fi]->torch->model;
    std::optional<TrainingState> training;
    if (drop_training) training.emplace(files[fi]->path, &m.graph);
    // Views with the same storage, start, dtype, shape and stride are one group, found by
    // hashing those fields of the tensor table (no copy of them per tensor).
    auto same_view = [&m](size_t a, size_t b) {
      const torch::Tensor& x = m.tensors[a];
      const torch::Tensor& y = m.tensors[b];
      return x.storage == y.storage && x.byte_begin == y.byte_begin && x.dtype == y.dtype &&
             x.shape == y.shape && x.stride == y.stride;
    };
    auto view_hash = [&m](size_t i) {
      const torch::Tensor& t = m.tensors[i];
      uint64_t h = std::hash<uint64_t>()(t.byte_begin) ^ (uint64_t(uint32_t(t.storage)) << 32) ^
                   (uint64_t(t.dtype) << 24);
      for (int64_t v : t.shape) h = h * 1000003 ^ std::hash<int64_t>()(v);
      for (int64_t v : t.stride) h = h * 1000003 ^ std::hash<int64_t>()(v);
      return static_cast<size_t>(h);
    };
    std::unordered_map<size_t, size_t, decltype(view_hash), decltype(same_view)> groups(
        m.tensors.size(), view_hash, same_view);  // tensor index -> index into items
    for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
      const torch::Tensor& t = m.tensors[ti];
      if (training && (training->whole_file() || training->Contains(t.names))) {
        ++left_out;
        continue;
      }
      std::vector<std::string> names;
      for (std::string_view n : t.names) {
        if (UnderPrefix(n, r.selected)) names.push_back(Relative(n, r.selected));
      }
      if (names.empty()) continue;
      const std::string& shown = names[0];  // the first name in the pickle's own order
      if (t.storage < 0) Fail("tensor '{}' ({}) has no data to export", shown, t.kind);
      if (t.kind == "qtensor" || t.kind.starts_with("sparse") || t.kind.starts_with("nested")) {
        Fail("tensor '{}' is {}; safetensors cannot hold it", shown, t.kind);
      }
      std::string_view st_dtype = torch::Info(t.dtype).safetensors;
      if (st_dtype.empty())
        Fail("tensor '{}': safetensors has no {} dtype", shown, torch::Name(t.dtype));
      for (const std::string& n : names) claim(n, fi);
      auto [g, fresh] = groups.emplace(ti, items.size());
      if (fresh) {
        ExportedTensor it;
        it.file = fi;
        it.tensor = ti;
        it.name = shown;
        it.dtype = t.dtype;
        it.size = t.numel * torch::ElementSize(t.dtype);
        it.from = t.dtype;
        if (Converts(o, t.dtype)) {
          it.convert = true;
          it.dtype = torch::DTypeOf(*o.to);
          it.size = t.numel * torch::ElementSize(it.dtype);
        }
        items.push_back(it);
      }
      // Tensors come in the pickle's order, so the group's first name was met first; the
      // others are aliases of it (as ZeRO and DCP exports record theirs).
      const ExportedTensor& kept = items[g->second];
      for (const std::string& n : names) {
        if (n != kept.name) aliases[n] = kept.name;
      }
    }
  }
  // From here on only the tensor table and the mapped bytes are read: the object graph (most
  // of a model's memory at 10^5 tensors) goes before the output is written and read back.
  for (const auto& f : files) {
    if (f->torch) f->torch->model.graph.Release();
  }
  if (items.empty()) {
    if (left_out)
      Fail("no tensors to export: all {} are training state (--all exports them)",
           Count(left_out, "tensor"));
    Fail("no tensors to export");
  }
  if (left_out) {
    r.warnings.push_back(
        fmt::format("{} left out (--all keeps them; --select PREFIX exports what is under PREFIX)",
                    Count(left_out, "training-state tensor")));
  }
  // Read order: by file, then where the tensor's bytes are in it.
  std::vector<uint32_t> by_position(items.size());
  for (uint32_t i = 0; i < by_position.size(); ++i) by_position[i] = i;
  auto position = [&](const ExportedTensor& it) {
    if (files[it.file]->st) {
      const safetensors::File& st = *files[it.file]->st;
      return std::make_pair(it.file, st.data_offset + st.tensors[it.tensor].begin);
    }
    const torch::Model& m = files[it.file]->torch->model;
    const torch::Tensor& t = m.tensors[it.tensor];
    return std::make_pair(it.file, m.storages[t.storage].data_offset + t.byte_begin);
  };
  std::sort(by_position.begin(), by_position.end(),
            [&](uint32_t a, uint32_t b) { return position(items[a]) < position(items[b]); });
  std::vector<TensorSource> outputs;
  outputs.reserve(items.size());
  ConversionTally tally(items.size());
  for (size_t i = 0; i < items.size(); ++i)
    outputs.push_back(SourceOf(items[i], i, *files[items[i].file], o.to, tally));
  for (uint32_t rank = 0; rank < by_position.size(); ++rank)
    outputs[by_position[rank]].read_order = rank;
  if (o.dry_run) {
    r.tensors = items.size();
    r.aliases = aliases.size();
    for (const ExportedTensor& it : items) r.bytes += it.size;
    return r;
  }
  SafetensorsModelOptions so;
  so.max_shard_size = o.max_shard_size;
  so.threads = o.threads;
  so.team = o.team;
  for (const auto& f : files) so.inputs.push_back(&f->map);
  SafetensorsModel written = WriteSafetensorsModel(to, std::move(outputs), aliases, so);
  if (o.to) {
    std::string w = tally.Warning(*o.to, [&](size_t i) { return items[i].name; });
    if (!w.empty()) r.warnings.push_back(std::move(w));
  }
  r.files = written.files;
  r.bytes = written.bytes;
  r.tensors = items.size();
  r.aliases = aliases.size();
  return r;
}

}  // namespace ckpt
