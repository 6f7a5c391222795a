#include "checkpoint/opened_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "base/error.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/training_state.h"
#include "compress/archive.h"
#include "io/range_stream.h"
#include "torch/global_policy.h"
#include "torch/tensor_bytes.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// The model's key in a folder of flat fqns (DCP): the first of the keys ModelKey knows that
// holds tensors.
std::string FlatModelKey(const LogicalModel& m) {
  for (const char* candidate : {"state_dict", "module", "model_state_dict", "model"}) {
    for (const LogicalTensor& t : m.tensors) {
      if (IsBelowKeyPath(t.name, candidate)) return candidate;
    }
  }
  return "";
}

}  // namespace

OpenedCheckpoint::~OpenedCheckpoint() = default;

std::unique_ptr<OpenedCheckpoint> OpenedCheckpoint::Open(const std::string& path,
                                                         const OpenOptions& o) {
  return Open(std::vector<std::string>{path}, o);
}

std::unique_ptr<OpenedCheckpoint> OpenedCheckpoint::Open(const std::string& path,
                                                         const OpenOptions& o,
                                                         const Volume& volume) {
  std::unique_ptr<OpenedCheckpoint> c(new OpenedCheckpoint());
  c->path_ = c->opened_ = path;
  c->sources_.push_back({path, &volume});
  c->OpenOne(path, ContainerOf(path, volume), o, volume);
  if (c->files_.size() > 1) c->Index();
  c->CheckZeroOptions(o);
  return c;
}

void OpenedCheckpoint::CheckZeroOptions(const OpenOptions& o) const {
  if (kind_ != "zero" && (!o.tag.empty() || o.exclude_frozen))
    throw UsageError("--tag and --exclude-frozen apply to DeepSpeed ZeRO checkpoints");
}

std::unique_ptr<OpenedCheckpoint> OpenedCheckpoint::Open(const std::vector<std::string>& paths,
                                                         const OpenOptions& o) {
  if (paths.empty()) Fail("no checkpoint given");
  std::unique_ptr<OpenedCheckpoint> c(new OpenedCheckpoint());
  c->path_ = paths.size() == 1 ? paths[0] : fmt::format("{} paths", paths.size());
  std::vector<std::string> opened;     // each path, an archive as the path it holds
  std::vector<Container> kinds;        // what each of those holds, decided once
  std::vector<const Volume*> volumes;  // and what it is read from
  for (const std::string& p : paths) {
    Container kind = ContainerOf(p);
    if (kind == Container::kArchive) {
      c->archives_.push_back(ArchiveView::Open(p, o.threads));
      const ArchiveView& v = *c->archives_.back();
      opened.push_back(v.root());
      volumes.push_back(&v.volume());
      kind = ContainerOf(opened.back(), v.volume());
    } else {
      opened.push_back(p);
      volumes.push_back(&Disk());
    }
    kinds.push_back(kind);
  }
  c->opened_ = opened[0];
  for (size_t i = 0; i < opened.size(); ++i) c->sources_.push_back({opened[i], volumes[i]});
  try {
    if (opened.size() == 1) {
      c->OpenOne(opened[0], kinds[0], o, *volumes[0]);
    } else {
      std::vector<std::pair<std::string, const Volume*>> files;
      for (size_t i = 0; i < opened.size(); ++i) {
        const std::string& p = opened[i];
        switch (kinds[i]) {
          case Container::kFile:
            files.emplace_back(p, volumes[i]);
            break;
          case Container::kModelFolder: {
            for (std::string& f : ModelFilesIn(p, o.all_files, *volumes[i]))
              files.emplace_back(std::move(f), volumes[i]);
            break;
          }
          case Container::kArchive:
          case Container::kZero:
          case Container::kDcp:
            Fail(
                "{}: an archive, a DeepSpeed ZeRO folder or a torch.distributed.checkpoint "
                "folder is one checkpoint: give it alone",
                p);
        }
      }
      c->kind_ = "files";
      c->OpenFiles(files);
    }
    if (c->files_.size() > 1) c->Index();  // refuses a name in two of the files
  } catch (const Error& e) {
    if (c->archives_.empty()) throw;
    std::string what = e.what();
    for (size_t i = 0, k = 0; i < paths.size(); ++i) {
      if (opened[i] != paths[i]) what = c->archives_[k++]->Rename(what, paths[i] + ": ");
    }
    Rethrow(e, what);
  }
  c->CheckZeroOptions(o);
  return c;
}

void OpenedCheckpoint::OpenOne(const std::string& at, Container kind, const OpenOptions& o,
                               const Volume& volume) {
  auto each = [&volume](std::vector<std::string> paths) {
    std::vector<std::pair<std::string, const Volume*>> out;
    for (std::string& p : paths) out.emplace_back(std::move(p), &volume);
    return out;
  };
  switch (kind) {
    case Container::kFile:
      OpenFiles(each({at}));
      kind_ = FormatName(files_[0]->format);
      return;
    case Container::kModelFolder:
      kind_ = "model-folder";
      OpenFiles(each(ModelFilesIn(at, o.all_files, volume)));
      return;
    case Container::kZero:
      kind_ = "zero";
      zero_ = std::make_unique<deepspeed::ZeroCheckpoint>(
          deepspeed::OpenZeroCheckpoint(at, o.tag, {}, volume));
      unsafe_ = zero_->findings;
      model_ = deepspeed::ZeroLogicalModel(*zero_, o.exclude_frozen);
      return;
    case Container::kDcp:
      OpenDcp(at, volume);
      return;
    case Container::kArchive:  // an archive inside an archive: compress never makes one
      Fail("{}: an archive of an archive", at);
  }
}

void OpenedCheckpoint::OpenDcp(const std::string& at, const Volume& volume) {
  kind_ = "dcp";
  dcp_ = std::make_unique<dcp::Checkpoint>(dcp::OpenDcp(at, {}, volume));
  const dcp::Checkpoint& d = *dcp_;
  if (!d.problems.empty()) {
    Fail("{}: {}: {} ({} problem(s) in all; run ckptool verify)", at, d.problems[0].where,
         d.problems[0].what, d.problems.size());
  }
  // The metadata is the index every tensor is read by: one that imports or calls anything
  // beyond plain data is not read further.
  for (const torch::UnsafeFinding& u : d.meta.scan.findings)
    Fail("{}: {}: the pickle {}; refusing to read it further", at, d.metadata_files[0], u.what);
  for (const dcp::Object& ob : d.objects) {
    for (const torch::UnsafeFinding& u : d.items[static_cast<size_t>(ob.item)].scan.findings)
      unsafe_.push_back(fmt::format("object '{}': the pickle {}", ob.fqn, u.what));
  }
  model_ = dcp::DcpLogicalModel(d);
  model_key_ = FlatModelKey(model_);
  const TrainingState training("", nullptr);
  for (LogicalTensor& t : model_.tensors) t.training = training.Contains(t.name);
}

void OpenedCheckpoint::OpenFiles(const std::vector<std::pair<std::string, const Volume*>>& paths) {
  model_.description = paths.size() == 1 ? paths[0].first : fmt::format("{} files", paths.size());
  for (const auto& [p, volume] : paths) {
    files_.push_back(std::make_unique<CheckpointFile>(OpenCheckpoint(*volume, p)));
    CheckpointFile& f = *files_.back();
    model_.inputs.push_back(&f.map);
    if (f.torch) {
      const torch::Model& m = f.torch->model;
      if (!m.problems.empty())
        Fail("{}: {}: {} (run ckptool verify)", p, m.problems[0].where, m.problems[0].what);
      for (const torch::UnsafeFinding& u : torch::FindUnsafe(m.graph))
        unsafe_.push_back(fmt::format("{}: the pickle {}", p, u.what));
      if (files_.size() == 1) model_key_ = ModelKey(m);
      AddTorchTensors(files_.size() - 1);
    } else {
      for (const auto& [k, v] : f.st->metadata) metadata_.emplace(k, v);
      AddSafetensorsTensors(files_.size() - 1);
    }
  }
}

void OpenedCheckpoint::AddTorchTensors(size_t source) {
  const CheckpointFile& f = *files_[source];
  const torch::Model& m = f.torch->model;
  const TrainingState training(f.path, &m.graph);
  // Identical views (same storage, start, dtype, shape and stride: tied weights saved as two
  // tensors, as state_dict() does) are one logical tensor named by the first of them in the
  // pickle's order, the others its aliases. Found by hashing those fields of the tensor table.
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
      m.tensors.size(), view_hash, same_view);  // torch tensor -> logical tensor
  const int32_t input = static_cast<int32_t>(model_.inputs.size() - 1);
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const torch::Tensor& t = m.tensors[ti];
    if (t.names.empty()) continue;
    const bool in_training = training.whole_file() || training.Contains(t.names);
    std::string why;
    if (t.kind != "tensor" && t.kind != "parameter") {
      why = "is a " + t.kind + " tensor";
    } else if (t.storage < 0) {
      why = "has no data";
    }
    if (!why.empty()) {
      UnreadableTensor u{{}, why, in_training};
      for (std::string_view n : t.names) u.names.emplace_back(n);
      unreadable_.push_back(std::move(u));
      continue;
    }
    auto [g, fresh] = groups.emplace(ti, model_.tensors.size());
    if (!fresh && model_.tensors[g->second].training == in_training) {
      for (std::string_view n : t.names)
        model_.aliases.emplace_back(std::string(n), model_.tensors[g->second].name);
      continue;
    }
    const torch::Storage& s = m.storages[t.storage];
    LogicalTensor lt{std::string(t.names.front()),
                     t.dtype,
                     t.dtype,
                     std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                     t.numel,
                     nullptr};
    lt.input = input;
    lt.offset = s.data_offset + t.byte_begin;
    lt.training = in_training;
    // The reads capture two pointers (the file and its tensor table's entry, which stay) so
    // that std::function holds them without an allocation per tensor.
    const CheckpointFile* fp = &f;
    const torch::Tensor* tp = &t;
    if (IsContiguous(t) && s.present && !s.compressed) {
      lt.read = [fp, tp](uint64_t first, uint64_t count, const SpanSink& sink) {
        const uint64_t size = torch::ElementSize(tp->dtype);
        const uint64_t at =
            fp->torch->model.storages[static_cast<size_t>(tp->storage)].data_offset +
            tp->byte_begin;
        StreamRange(fp->map, at + first * size, count * size,
                    [&sink](uint64_t, Bytes b) { sink(b); });
      };
    } else {
      lt.whole = true;
      lt.read = [fp, tp](uint64_t first, uint64_t count, const SpanSink& sink) {
        std::string_view name = tp->names.front();
        if (first != 0 || count != tp->numel)
          Fail("internal: tensor '{}' is strided or compressed: read it whole", name);
        if (fp->torch->model.storages[static_cast<size_t>(tp->storage)].compressed)
          Fail("tensor '{}': its storage record is compressed", name);
        StreamTensorBytes(fp->map, *fp->torch, *tp, sink);
      };
    }
    size_t owner = model_.tensors.size();
    model_.tensors.push_back(std::move(lt));
    for (size_t k = 1; k < t.names.size(); ++k)
      model_.aliases.emplace_back(std::string(t.names[k]), model_.tensors[owner].name);
  }
}

void OpenedCheckpoint::AddSafetensorsTensors(size_t source) {
  const CheckpointFile& f = *files_[source];
  const TrainingState training(f.path, nullptr);
  const int32_t input = static_cast<int32_t>(model_.inputs.size() - 1);
  for (const safetensors::TensorEntry& e : f.st->tensors) {
    std::optional<torch::DType> dtype = torch::FromSafetensors(e.dtype);
    std::optional<std::vector<int64_t>> shape;
    if (dtype) shape = torch::TorchShape(*dtype, e.shape);
    if (!dtype || !shape) {
      unreadable_.push_back(
          {{e.name},
           dtype
               ? fmt::format("is {} with an odd last dimension, which has no torch shape", e.dtype)
               : fmt::format("is {}, which torch has no dtype for", e.dtype),
           training.Contains(e.name)});
      continue;
    }
    uint64_t numel = 1;
    for (int64_t d : *shape) numel *= static_cast<uint64_t>(d);
    const uint64_t at = f.st->data_offset + e.begin, size = torch::ElementSize(*dtype);
    LogicalTensor lt{e.name, *dtype, *dtype, *shape, numel, nullptr};
    lt.read = [&f, at, size](uint64_t first, uint64_t count, const SpanSink& sink) {
      StreamRange(f.map, at + first * size, count * size, [&sink](uint64_t, Bytes b) { sink(b); });
    };
    lt.input = input;
    lt.offset = at;
    lt.training = training.Contains(e.name);
    model_.tensors.push_back(std::move(lt));
  }
}

void OpenedCheckpoint::Index() const {
  std::call_once(indexed_, [this] { BuildIndex(); });
}

void OpenedCheckpoint::BuildIndex() const {
  auto file_of = [&](int64_t i) {
    int32_t input = model_.tensors[static_cast<size_t>(i)].input;
    return input < 0 ? path_ : files_[static_cast<size_t>(input)]->path;
  };
  auto add = [&](std::string_view name, int64_t i) {
    auto [it, fresh] = index_.emplace(name, i);
    if (!fresh && it->second != i) {
      Fail(
          "'{}' is in both {} and {}: these are separate checkpoints, not the shards of one "
          "model; give one of them",
          name, file_of(it->second), file_of(i));
    }
  };
  index_.reserve(model_.tensors.size() + model_.aliases.size());
  for (size_t i = 0; i < model_.tensors.size(); ++i)
    add(model_.tensors[i].name, static_cast<int64_t>(i));
  for (const auto& [alias, owner] : model_.aliases) {
    auto it = index_.find(owner);
    if (it != index_.end()) add(alias, it->second);
  }
}

LogicalModel OpenedCheckpoint::TakeModel() {
  std::call_once(indexed_, [] {});  // never built after this: the names go with the model
  index_.clear();
  LogicalModel m = std::move(model_);
  model_ = LogicalModel();
  return m;
}

void OpenedCheckpoint::ReleaseParsed() {
  for (const auto& f : files_) {
    if (f->torch) f->torch->model.graph.Release();
  }
  if (dcp_) dcp_->meta.graph = pickle::Graph();
  // The rank files' tensors come from their maps by offset: their parsed pickles, tensor
  // tables and zip directories are done with.
  if (zero_) {
    for (auto& f : zero_->files) f->torch.reset();
  }
}

const std::string* OpenedCheckpoint::DirectFile(const LogicalTensor& t) const {
  // A file's tensors have input = its index in files_ (OpenFiles adds one input per file).
  if (t.input < 0 || t.whole) return nullptr;
  for (const Source& s : sources_)
    if (s.volume != &Disk()) return nullptr;  // a member of an archive: no file to map
  return &files_[static_cast<size_t>(t.input)]->path;
}

std::vector<std::string> OpenedCheckpoint::Warnings() const {
  std::vector<std::string> out;
  for (const std::string& u : unsafe_) out.push_back(u + " (never run)");
  out.insert(out.end(), model_.warnings.begin(), model_.warnings.end());
  for (const UnreadableTensor& u : unreadable_)
    out.push_back(fmt::format("'{}' {}: not readable here", u.names[0], u.why));
  return out;
}

std::vector<std::string> OpenedCheckpoint::Names() const {
  Index();
  std::vector<std::string> out;
  out.reserve(model_.tensors.size() + model_.aliases.size());
  for (const LogicalTensor& t : model_.tensors) out.push_back(t.name);
  for (const auto& [alias, owner] : model_.aliases) {
    if (index_.count(alias)) out.push_back(alias);
  }
  return out;
}

int64_t OpenedCheckpoint::Find(const std::string& name) const {
  Index();
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace ckpt
