#include "dcp/dcp_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/names.h"
#include "dcp/dcp_parts.h"

namespace ckpt::dcp {

namespace fs = std::filesystem;

std::string OffsetsText(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() == 1 ? ",)" : ")");
}

std::string KeyOf(const std::string& fqn, const std::vector<int64_t>& offsets) {
  std::string k = fqn;
  k.push_back('\0');
  for (int64_t o : offsets) k += std::to_string(o) + ",";
  return k;
}

namespace {

// Does `path` stay inside the folder (relative, no "..")?
bool SafeRelativePath(const std::string& path) {
  if (path.empty() || path[0] == '/' || path.find('\0') != std::string::npos) return false;
  for (const auto& part : fs::path(path)) {
    if (part == "..") return false;
  }
  return true;
}

// Merges per-rank metadata files into one view (writers without collectives): entries by
// fqn, chunks by (offsets, sizes), in one pass over all of them.
class MetadataMerger {
 public:
  explicit MetadataMerger(Metadata& into) : into_(into) {
    for (size_t i = 0; i < into_.entries.size(); ++i) Index(i);
  }

  void Add(Metadata from, const std::string& name) {
    for (EntryMeta& e : from.entries) {
      auto it = by_fqn_.find(e.fqn);
      if (it == by_fqn_.end()) {
        into_.entries.push_back(std::move(e));
        Index(into_.entries.size() - 1);
        continue;
      }
      EntryMeta& x = into_.entries[it->second];
      if (x.bytes != e.bytes || x.dtype != e.dtype || x.shape != e.shape)
        Fail("{}: '{}' is described differently than by the metadata files before it", name, e.fqn);
      for (ChunkMeta& cm : e.chunks) {
        if (chunks_.insert(ChunkKey(e.fqn, cm)).second) x.chunks.push_back(std::move(cm));
      }
    }
    for (StorageEntry& st : from.storage) {
      st.info = pickle::kNil;  // not in `into`'s graph
      into_.storage.push_back(std::move(st));
    }
    into_.scan.findings.insert(into_.scan.findings.end(), from.scan.findings.begin(),
                               from.scan.findings.end());
    into_.scan.names.insert(into_.scan.names.end(), from.scan.names.begin(), from.scan.names.end());
  }

 private:
  static std::string ChunkKey(const std::string& fqn, const ChunkMeta& cm) {
    return KeyOf(fqn, cm.offsets) + "/" + KeyOf("", cm.sizes);
  }
  void Index(size_t i) {
    const EntryMeta& e = into_.entries[i];
    by_fqn_.emplace(e.fqn, i);
    for (const ChunkMeta& cm : e.chunks) chunks_.insert(ChunkKey(e.fqn, cm));
  }

  Metadata& into_;
  std::unordered_map<std::string, size_t> by_fqn_;
  std::unordered_set<std::string> chunks_;
};

std::vector<std::string> MetadataFiles(const std::string& folder, const Volume& volume) {
  std::vector<std::string> out;
  if (volume.IsFile((fs::path(folder) / ".metadata").string())) return {".metadata"};
  if (!volume.IsFolder(folder)) return out;
  for (const Node& e : volume.List(folder)) {
    std::string n = fs::path(e.path).filename().string();
    if (n.starts_with("__") && n.ends_with(".metadata") && volume.IsFile(e.path)) out.push_back(n);
  }
  std::sort(out.begin(), out.end(), DigitAwareLess);
  return out;
}

}  // namespace

bool LooksLikeDcpCheckpoint(const std::string& path, const Volume& volume) {
  if (!volume.IsFolder(path) || MetadataFiles(path, volume).empty()) return false;
  try {
    for (const Node& e : volume.List(path)) {
      if (fs::path(e.path).extension() == ".distcp") return true;
    }
  } catch (const Error&) {
  }
  return false;
}

bool IsDcpPart(const std::string& path) {
  fs::path p(path);
  std::string n = p.filename().string();
  return p.extension() == ".distcp" || n == ".metadata" ||
         (n.starts_with("__") && n.ends_with(".metadata"));
}

Checkpoint ReadDcp(Bytes metadata, const std::map<std::string, Bytes>& files) {
  Checkpoint c;
  c.metadata_files = {".metadata"};
  c.metadata_bytes = metadata.size();
  c.meta = WithContext(".metadata", [&] { return ParseMetadata(metadata); });
  for (const auto& [name, bytes] : files) c.files.push_back({name, nullptr, bytes, 0, 0});
  Resolve(c);
  return c;
}

namespace {

// The metadata files of `folder` read and merged into c.meta (names and bytes recorded).
void ReadMetadataInto(const std::string& folder, Checkpoint& c, const Volume& volume) {
  c.metadata_files = MetadataFiles(folder, volume);
  if (c.metadata_files.empty())
    Fail("no .metadata file: not a torch.distributed.checkpoint folder");
  std::optional<MetadataMerger> merger;
  for (size_t i = 0; i < c.metadata_files.size(); ++i) {
    const std::string& name = c.metadata_files[i];
    MappedFile m = volume.Open((fs::path(folder) / name).string());
    c.metadata_bytes += m.size();
    Metadata md = WithContext(name, [&] { return ParseMetadata(m.bytes()); });
    if (i == 0) {
      c.meta = std::move(md);
      // Indexes every entry and chunk: only worth it when there is something to merge.
      if (c.metadata_files.size() > 1) merger.emplace(c.meta);
    } else {
      merger->Add(std::move(md), name);
    }
  }
}

}  // namespace

Metadata ReadFolderMetadata(const std::string& folder, const Volume& volume) {
  return WithContext(folder, [&] {
    Checkpoint c;
    ReadMetadataInto(folder, c, volume);
    return std::move(c.meta);
  });
}

Checkpoint OpenDcp(const std::string& folder, const torch::Trust& trust, const Volume& volume) {
  return WithContext(folder, [&] {
    Checkpoint c;
    c.folder = folder;
    c.trust = trust;
    ReadMetadataInto(folder, c, volume);
    std::vector<std::string> paths;
    for (const StorageEntry& s : c.meta.storage) paths.push_back(s.path);
    std::sort(paths.begin(), paths.end(), DigitAwareLess);
    paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
    for (const std::string& p : paths) {
      if (!SafeRelativePath(p))
        Fail("storage_data names the file '{}', which is outside the folder", p);
      std::string full = (fs::path(folder) / p).string();
      if (!volume.IsFile(full)) continue;  // Resolve reports it with its tensors
      auto map = std::make_unique<MappedFile>(volume.Open(full));
      Bytes b = map->bytes();
      c.files.push_back({p, std::move(map), b, 0, 0});
    }
    Resolve(c);
    return c;
  });
}

}  // namespace ckpt::dcp
