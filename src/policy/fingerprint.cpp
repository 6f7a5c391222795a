#include "policy/fingerprint.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "base/error.h"
#include "file/checkpoint_file.h"
#include "io/crc32.h"
#include "io/mapped_file.h"
#include "zip/zip_archive.h"

namespace ckpt::policy {

namespace fs = std::filesystem;

namespace {

constexpr uint64_t kEnds = 1 << 20;

bool Excluded(const std::string& rel, const std::vector<std::string>& exclude) {
  for (const std::string& e : exclude) {
    if (rel == e ||
        (rel.size() > e.size() && rel.compare(0, e.size(), e) == 0 && rel[e.size()] == '/')) {
      return true;
    }
  }
  return false;
}

bool StatFile(const fs::path& p, FileState* s) {
  struct stat st {};
  if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  s->size = static_cast<uint64_t>(st.st_size);
  s->mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  s->ctime_ns = static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec;
  s->inode = static_cast<uint64_t>(st.st_ino);
  return true;
}

std::string Hash(const fs::path& p) {
  MappedFile m = MappedFile::Open(p.string());
  Bytes b = m.bytes();
  if (DetectFormat(b) == Format::kTorchZip) {
    try {
      zip::Archive a = zip::Archive::Parse(b);
      if (!a.entries().empty() && a.entries()[0].name.ends_with("data.pkl")) {
        return fmt::format("pickle:{:08x}", Crc32(0, zip::RawData(b, a.entries()[0])));
      }
    } catch (const Error&) {
      // Not readable as a zip after all: hash its ends like any file.
    }
  }
  uint32_t crc = Crc32(0, b.subspan(0, std::min<uint64_t>(kEnds, b.size())));
  if (b.size() > kEnds) {
    uint64_t from = std::max<uint64_t>(kEnds, b.size() - kEnds);
    crc = Crc32(crc, b.subspan(from));
  }
  return fmt::format("ends:{:08x}", crc);
}

bool SameStatFile(const FileState& a, const FileState& b) {
  return a.size == b.size && a.mtime_ns == b.mtime_ns && a.ctime_ns == b.ctime_ns &&
         a.inode == b.inode;
}

}  // namespace

Fingerprint StatCheckpoint(const std::string& root, const std::string& name,
                           const std::vector<std::string>& exclude) {
  Fingerprint fp;
  fs::path base = fs::path(root) / name;
  std::error_code ec;
  FileState s;
  if (StatFile(base, &s)) {
    fp[name] = s;
    return fp;
  }
  if (!fs::is_directory(fs::symlink_status(base, ec))) return fp;
  for (fs::recursive_directory_iterator it(base, fs::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec)) {
    std::string rel = (fs::path(name) / it->path().lexically_relative(base)).string();
    if (Excluded(rel, exclude)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (StatFile(it->path(), &s)) fp[rel] = s;
  }
  return fp;
}

void HashFiles(const std::string& root, Fingerprint& fp, const Fingerprint* known) {
  for (auto& [rel, s] : fp) {
    if (!s.hash.empty()) continue;
    if (known) {
      auto it = known->find(rel);
      if (it != known->end() && !it->second.hash.empty() && SameStatFile(it->second, s)) {
        s.hash = it->second.hash;
        continue;
      }
    }
    try {
      s.hash = Hash(fs::path(root) / rel);
    } catch (const Error&) {
      s.hash.clear();  // gone or unreadable: the comparison sees a difference
    }
  }
}

bool SameCheckpoint(const std::string& root, Fingerprint& now, const Fingerprint& recorded,
                    std::string* what) {
  for (const auto& [rel, r] : recorded) {
    if (!now.count(rel)) {
      *what = rel + " is gone";
      return false;
    }
  }
  for (auto& [rel, n] : now) {
    auto it = recorded.find(rel);
    if (it == recorded.end()) {
      *what = rel + " is new";
      return false;
    }
    const FileState& r = it->second;
    if (n.size != r.size || n.mtime_ns != r.mtime_ns) {
      *what = rel + (n.size != r.size ? " changed size" : " was modified");
      return false;
    }
    if (n.inode == r.inode && n.ctime_ns == r.ctime_ns) {
      if (n.hash.empty()) n.hash = r.hash;
      continue;
    }
    if (n.hash.empty()) {
      try {
        n.hash = Hash(fs::path(root) / rel);
      } catch (const Error&) {
      }
    }
    if (n.hash.empty() || n.hash != r.hash) {
      *what = rel + " was rewritten (its time was kept, its content differs)";
      return false;
    }
  }
  return true;
}

bool SameStat(const Fingerprint& a, const Fingerprint& b) {
  if (a.size() != b.size()) return false;
  for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
    if (ia->first != ib->first || !SameStatFile(ia->second, ib->second)) return false;
  }
  return true;
}

int64_t NewestMtimeNs(const Fingerprint& fp) {
  int64_t t = 0;
  for (const auto& [rel, s] : fp) t = std::max(t, s.mtime_ns);
  return t;
}

uint64_t TotalBytes(const Fingerprint& fp) {
  uint64_t n = 0;
  for (const auto& [rel, s] : fp) n += s.size;
  return n;
}

nlohmann::ordered_json ToJson(const Fingerprint& fp) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [rel, s] : fp) {
    j[rel] = {{"size", s.size},
              {"mtime_ns", s.mtime_ns},
              {"ctime_ns", s.ctime_ns},
              {"inode", s.inode},
              {"hash", s.hash}};
  }
  return j;
}

Fingerprint FingerprintFromJson(const nlohmann::json& j) {
  if (!j.is_object()) Fail("a checkpoint's files must be an object");
  Fingerprint fp;
  for (const auto& [rel, v] : j.items()) {
    if (!v.is_object()) Fail("file '{}': not an object", rel);
    FileState s;
    try {
      s.size = v.at("size").get<uint64_t>();
      s.mtime_ns = v.at("mtime_ns").get<int64_t>();
      s.ctime_ns = v.at("ctime_ns").get<int64_t>();
      s.inode = v.at("inode").get<uint64_t>();
      s.hash = v.at("hash").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
      Fail("file '{}': {}", rel, e.what());
    }
    fp[rel] = s;
  }
  return fp;
}

}  // namespace ckpt::policy
