#include "checkpoint/discovery.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <system_error>

#include "base/error.h"
#include "checkpoint/manifest_name.h"
#include "checkpoint/training_state.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "file/checkpoint_file.h"
#include "io/mapped_file.h"
#include "io/temp_files.h"
#include "safetensors/shard_index.h"

namespace ckpt {

namespace fs = std::filesystem;

Container ContainerOf(const std::string& path, const Volume& volume) {
  if (!volume.Exists(path)) Fail("{}: no such file or folder", path);
  if (!volume.IsFolder(path))
    return ckz::IsArchiveFile(path, volume) ? Container::kArchive : Container::kFile;
  if (deepspeed::LooksLikeZeroCheckpoint(path, volume)) return Container::kZero;
  if (dcp::LooksLikeDcpCheckpoint(path, volume)) return Container::kDcp;
  return Container::kModelFolder;
}

std::vector<Located> Locate(const std::vector<std::string>& inputs,
                            std::vector<std::string>* skipped) {
  return Locate(nullptr, inputs, skipped);
}

std::vector<Located> Locate(std::shared_ptr<const Volume> volume,
                            const std::vector<std::string>& inputs,
                            std::vector<std::string>* skipped) {
  const Volume& v = OrDisk(volume.get());
  std::vector<std::string> archives, paths, zero, dcp_folders;
  for (const std::string& p : inputs) {
    // A path that is not there is left to the walk, which reports it as the commands did.
    Container kind = v.Exists(p) ? ContainerOf(p, v) : Container::kFile;
    (kind == Container::kArchive ? archives : paths).push_back(p);
    if (kind == Container::kZero) zero.push_back(p);
  }
  std::vector<std::string> files = ExpandInputs(paths, skipped, &dcp_folders, v);
  std::vector<Located> out;
  out.reserve(archives.size() + files.size() + zero.size() + dcp_folders.size());
  for (std::string& p : archives) out.push_back({Container::kArchive, std::move(p), volume});
  for (std::string& p : files) out.push_back({Container::kFile, std::move(p), volume});
  for (std::string& p : zero) out.push_back({Container::kZero, std::move(p), volume});
  for (std::string& p : dcp_folders) out.push_back({Container::kDcp, std::move(p), volume});
  return out;
}

std::vector<std::string> ExpandInputs(const std::vector<std::string>& inputs,
                                      std::vector<std::string>* skipped,
                                      std::vector<std::string>* dcp_folders, const Volume& volume) {
  std::vector<std::string> out;
  std::map<std::string, bool> is_dcp;  // folder -> holds a DCP checkpoint
  auto in_dcp_folder = [&](const fs::path& file) {
    std::string folder = file.parent_path().string();
    auto [it, fresh] = is_dcp.emplace(folder, false);
    if (fresh) {
      it->second = dcp::LooksLikeDcpCheckpoint(folder.empty() ? "." : folder, volume);
      if (it->second && dcp_folders) dcp_folders->push_back(folder.empty() ? "." : folder);
    }
    return it->second && dcp::IsDcpPart(file.string());
  };
  for (const std::string& input : inputs) {
    if (!volume.IsFolder(input)) {
      if (dcp::IsDcpPart(input) && in_dcp_folder(fs::path(input))) continue;
      out.push_back(input);
      continue;
    }

    std::vector<std::string> found;
    auto visit = [&](const Node& n) {
      if (n.type != NodeType::kFile) return;  // links are not followed
      const std::string& p = n.path;
      std::string name = fs::path(p).filename().string();
      // ckptool's own temp files (a run killed outright leaves them) are never inputs.
      if (IsTempFileName(name)) return;
      if (IsManifestName(name)) return;  // checkpoint/manifest_name.h
      if (in_dcp_folder(fs::path(p))) return;
      try {
        MappedFile m = volume.Open(p);
        if (DetectFormat(m.bytes()) || !CutCheckpointReason(p, m.bytes()).empty()) {
          found.push_back(p);  // a checkpoint file, or what is left of one (damage to report)
        } else if (skipped) {
          skipped->push_back(p);
        }
      } catch (const Error&) {
        if (skipped) skipped->push_back(p);
      }
    };
    // A temp folder is one strip was building when it was stopped: not entered.
    volume.Walk(input, visit, [](const Node& n) {
      return !IsTempFileName(fs::path(n.path).filename().string());
    });
    std::sort(found.begin(), found.end());
    out.insert(out.end(), found.begin(), found.end());
  }
  return out;
}

std::optional<FileKind> FileKindOf(const std::string& path) {
  std::optional<Format> f = DetectFormat(MappedFile::Open(path).bytes());
  if (!f) return std::nullopt;
  return *f == Format::kSafetensors ? FileKind::kSafetensors : FileKind::kTorch;
}

std::vector<std::string> ModelFilesIn(const std::string& folder, bool all, const Volume& volume) {
  std::vector<std::string> safetensors, torch_files;
  std::set<std::string> indexed;
  for (const Node& e : volume.List(folder)) {
    if (e.type != NodeType::kFile) continue;  // links (last.ckpt) repeat a file
    std::string path = e.path, name = fs::path(e.path).filename().string();
    if (name.ends_with(".index.json")) {
      for (const std::string& shard : safetensors::WeightMapFiles(path, volume)) {
        indexed.insert((fs::path(folder) / shard).string());
      }
      continue;
    }
    if (!all && (IsTrainingOnlyFile(path) || name == "training_args.bin")) continue;
    MappedFile m = volume.Open(path);
    std::optional<Format> f = DetectFormat(m.bytes());
    if (!f) continue;
    (*f == Format::kSafetensors ? safetensors : torch_files).push_back(path);
  }
  std::vector<std::string> found;
  if (!indexed.empty()) {
    found.assign(indexed.begin(), indexed.end());
    if (all) {  // the training files beside the model's shards
      for (const std::string& t : torch_files) {
        if (!indexed.count(t) && IsTrainingOnlyFile(t)) found.push_back(t);
      }
    }
  } else if (!safetensors.empty()) {
    found = safetensors;
    if (all) found.insert(found.end(), torch_files.begin(), torch_files.end());
  } else {
    found = torch_files;
  }
  std::sort(found.begin(), found.end());
  if (found.empty()) Fail("{}: no model files in this folder", folder);
  return found;
}

bool IsSafetensorsModelFolder(const std::string& path) {
  if (ContainerOf(path) != Container::kModelFolder) return false;
  std::vector<std::string> files = ModelFilesIn(path, false);
  return std::all_of(files.begin(), files.end(),
                     [](const std::string& f) { return FileKindOf(f) == FileKind::kSafetensors; });
}

}  // namespace ckpt
