#include "ops/opened_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>
#include <unordered_map>

#include "base/error.h"
#include "compress/archive.h"
#include "io/range_stream.h"
#include "ops/discovery.h"
#include "ops/zero_export.h"
#include "torch/global_policy.h"
#include "torch/tensor_bytes.h"

namespace ckpt {

namespace fs = std::filesystem;

OpenedCheckpoint::~OpenedCheckpoint() = default;

std::unique_ptr<OpenedCheckpoint> OpenedCheckpoint::Open(const std::string& path,
                                                         const OpenOptions& o) {
  std::unique_ptr<OpenedCheckpoint> c(new OpenedCheckpoint());
  c->path_ = c->opened_ = path;
  std::error_code ec;
  if (!fs::exists(path, ec)) Fail("{}: no such file or folder", path);
  if (fs::is_regular_file(path, ec) && ckz::IsArchiveFile(path)) {
    c->archive_ = ArchiveView::Open(path, ReadOnlyTempParent(), o.threads);
    c->opened_ = c->archive_->root();
  }
  const std::string& at = c->opened_;
  try {
    if (fs::is_directory(at, ec)) {
      if (deepspeed::LooksLikeZeroCheckpoint(at)) {
        c->kind_ = "zero";
        c->zero_ =
            std::make_unique<deepspeed::ZeroCheckpoint>(deepspeed::OpenZeroCheckpoint(at, o.tag));
        c->model_ = ZeroLogicalModel(*c->zero_, false);
        c->places_.resize(c->model_.tensors.size());
      } else if (dcp::LooksLikeDcpCheckpoint(at)) {
        c->kind_ = "dcp";
        c->dcp_ = std::make_unique<dcp::Checkpoint>(dcp::OpenDcp(at));
        const dcp::Checkpoint& d = *c->dcp_;
        if (!d.problems.empty()) {
          Fail("{}: {} ({} problem(s) in all; run ckptool verify)", d.problems[0].where,
               d.problems[0].what, d.problems.size());
        }
        for (const torch::UnsafeFinding& u : d.meta.scan.findings)
          c->model_.warnings.push_back(fmt::format("the metadata's pickle {} (never run)", u.what));
        LogicalModel m = dcp::DcpLogicalModel(d);
        m.warnings.insert(m.warnings.begin(), c->model_.warnings.begin(), c->model_.warnings.end());
        c->model_ = std::move(m);
        c->places_.resize(c->model_.tensors.size());
      } else {
        c->kind_ = "model-folder";
        c->OpenFiles(ModelFilesIn(at, false));
      }
    } else {
      c->OpenFiles({at});
      c->kind_ = FormatName(c->files_[0]->format);
    }
  } catch (const Error& e) {
    if (!c->archive_) throw;
    Fail("{}", c->archive_->Rename(e.what(), path + ": "));
  }
  c->Index();
  return c;
}

void OpenedCheckpoint::OpenFiles(const std::vector<std::string>& paths) {
  model_.description = paths.size() == 1 ? paths[0] : fmt::format("{} files", paths.size());
  for (const std::string& p : paths) {
    files_.push_back(std::make_unique<CheckpointFile>(OpenCheckpoint(p)));
    CheckpointFile& f = *files_.back();
    model_.inputs.push_back(&f.map);
    if (f.torch) {
      const torch::Model& m = f.torch->model;
      if (!m.problems.empty())
        Fail("{}: {}: {} (run ckptool verify)", p, m.problems[0].where, m.problems[0].what);
      for (const torch::UnsafeFinding& u : torch::FindUnsafe(m.graph))
        model_.warnings.push_back(fmt::format("{}: the pickle {} (never run)", p, u.what));
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
  for (size_t ti = 0; ti < m.tensors.size(); ++ti) {
    const torch::Tensor& t = m.tensors[ti];
    if (t.names.empty()) continue;
    std::string name(t.names.front());
    if (t.kind != "tensor" && t.kind != "parameter") {
      model_.warnings.push_back(
          fmt::format("'{}' is a {} tensor: not readable here", name, t.kind));
      continue;
    }
    if (t.storage < 0) continue;
    const torch::Storage& s = m.storages[t.storage];
    LogicalTensor lt{name,    t.dtype,
                     t.dtype, std::vector<int64_t>(t.shape.begin(), t.shape.end()),
                     t.numel, nullptr};
    TensorPlace place;
    place.source = static_cast<int32_t>(source);
    place.torch_tensor = static_cast<int32_t>(ti);
    const uint64_t size = torch::ElementSize(t.dtype);
    if (IsContiguous(t) && s.present && !s.compressed) {
      uint64_t at = s.data_offset + t.byte_begin;
      if (!archive_) {
        place.file = f.path;
        place.offset = at;
      }
      lt.read = [&f, at, size](uint64_t first, uint64_t count, const SpanSink& sink) {
        StreamRange(f.map, at + first * size, count * size,
                    [&sink](uint64_t, Bytes b) { sink(b); });
      };
    } else {
      const torch::Tensor* tp = &t;
      lt.read = [&f, tp, name](uint64_t first, uint64_t count, const SpanSink& sink) {
        if (first != 0 || count != tp->numel)
          Fail("internal: tensor '{}' is strided or compressed: read it whole", name);
        StreamTensorBytes(f.map, *f.torch, *tp, sink);
      };
    }
    size_t owner = model_.tensors.size();
    model_.tensors.push_back(std::move(lt));
    places_.push_back(place);
    for (size_t k = 1; k < t.names.size(); ++k)
      model_.aliases.emplace_back(std::string(t.names[k]), model_.tensors[owner].name);
  }
}

void OpenedCheckpoint::AddSafetensorsTensors(size_t source) {
  const CheckpointFile& f = *files_[source];
  for (const safetensors::TensorEntry& e : f.st->tensors) {
    std::optional<torch::DType> dtype = torch::FromSafetensors(e.dtype);
    if (!dtype) {
      model_.warnings.push_back(fmt::format("'{}': torch has no {} dtype", e.name, e.dtype));
      continue;
    }
    std::optional<std::vector<int64_t>> shape = torch::TorchShape(*dtype, e.shape);
    if (!shape) {
      model_.warnings.push_back(fmt::format("'{}': no torch shape for {}", e.name, e.dtype));
      continue;
    }
    uint64_t numel = 1;
    for (int64_t d : *shape) numel *= static_cast<uint64_t>(d);
    const uint64_t at = f.st->data_offset + e.begin, size = torch::ElementSize(*dtype);
    LogicalTensor lt{e.name, *dtype, *dtype, *shape, numel, nullptr};
    lt.read = [&f, at, size](uint64_t first, uint64_t count, const SpanSink& sink) {
      StreamRange(f.map, at + first * size, count * size, [&sink](uint64_t, Bytes b) { sink(b); });
    };
    TensorPlace place;
    if (!archive_) {
      place.file = f.path;
      place.offset = at;
    }
    place.source = static_cast<int32_t>(source);
    model_.tensors.push_back(std::move(lt));
    places_.push_back(place);
  }
}

void OpenedCheckpoint::Index() {
  auto add = [&](const std::string& name, int64_t i) {
    auto [it, fresh] = index_.emplace(name, i);
    if (!fresh && it->second != i)
      Fail("{}: '{}' is in two of its files: these are separate checkpoints", path_, name);
  };
  for (size_t i = 0; i < model_.tensors.size(); ++i)
    add(model_.tensors[i].name, static_cast<int64_t>(i));
  for (const auto& [alias, owner] : model_.aliases) {
    auto it = index_.find(owner);
    if (it != index_.end()) add(alias, it->second);
  }
}

std::vector<std::string> OpenedCheckpoint::Names() const {
  std::vector<std::string> out;
  out.reserve(model_.tensors.size() + model_.aliases.size());
  for (const LogicalTensor& t : model_.tensors) out.push_back(t.name);
  for (const auto& [alias, owner] : model_.aliases) {
    if (index_.count(alias)) out.push_back(alias);
  }
  return out;
}

int64_t OpenedCheckpoint::Find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

}  // namespace ckpt
