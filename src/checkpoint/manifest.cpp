#include "checkpoint/manifest.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "base/error.h"
#include "base/interrupt.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "checkpoint/opened_checkpoint.h"
#include "io/atomic_output.h"
#include "io/parallel.h"
#include "io/sha256.h"
#include "io/temp_files.h"
#include "writers/element_convert.h"

namespace ckpt {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr const char* kFormat = "ckptool-manifest/1";
// What OpenSSF model signing leaves out of a model by default (ignore_git_paths).
constexpr const char* kGitPaths[] = {".git", ".gitattributes", ".github", ".gitignore"};

struct Tree {
  std::vector<std::string> files;                             // relative POSIX paths, sorted
  std::vector<std::pair<std::string, std::string>> symlinks;  // relative path, target
};

bool Ignored(const std::string& rel) {
  std::string first = rel.substr(0, rel.find('/'));
  for (const char* g : kGitPaths) {
    if (first == g) return true;
  }
  std::string name = fs::path(rel).filename().string();
  return IsManifestName(name) || IsTempFileName(name);
}

// What a manifest of `path` covers: the file itself, or every file below the folder.
Tree Walk(const std::string& path) {
  Tree t;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) {
    if (fs::is_regular_file(path, ec)) t.files.push_back(fs::path(path).filename().string());
    return t;
  }
  for (auto it = fs::recursive_directory_iterator(path); it != fs::recursive_directory_iterator();
       ++it) {
    std::string rel = fs::path(it->path()).lexically_relative(path).generic_string();
    if (Ignored(rel)) {
      if (it->is_directory() && !it->is_symlink()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink()) {
      t.symlinks.emplace_back(rel, fs::read_symlink(it->path()).string());
    } else if (it->is_regular_file()) {
      t.files.push_back(rel);
    }
  }
  std::sort(t.files.begin(), t.files.end());
  std::sort(t.symlinks.begin(), t.symlinks.end());
  return t;
}

// The folder the relative names of a manifest of `path` start from.
std::string Base(const std::string& path) {
  return fs::is_directory(path) ? path : fs::path(path).parent_path().string();
}

std::string Join(const std::string& base, const std::string& rel) {
  return base.empty() ? rel : (fs::path(base) / rel).string();
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// The tensors of one checkpoint unit (a file, a DCP or ZeRO folder) as name -> digest.
Json DigestsOf(const std::string& path, unsigned threads, std::vector<std::string>* notes,
               uint64_t* count) {
  OpenOptions oo;
  oo.threads = threads;
  std::unique_ptr<OpenedCheckpoint> c = OpenedCheckpoint::Open(path, oo);
  const LogicalModel& m = c->model();
  std::vector<std::string> digests(m.tensors.size());
  ParallelFor(m.tensors.size(), threads, [&](size_t i) {
    try {
      digests[i] = TensorDigest(m.tensors[i]);
    } catch (const Error&) {
      digests[i].clear();  // noted below
    }
  });
  Json out = Json::object();
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    if (digests[i].empty()) {
      notes->push_back(fmt::format("{}: {}: no digest (its elements cannot be read as {})", path,
                                   m.tensors[i].name, torch::Name(m.tensors[i].dtype)));
      continue;
    }
    out[m.tensors[i].name] = digests[i];
    ++*count;
  }
  for (const UnreadableTensor& u : c->unreadable()) {
    for (const std::string& n : u.names)
      notes->push_back(fmt::format("{}: {}: no digest ({})", path, n, u.why));
  }
  return out;
}

// The units whose tensors a manifest of `path` digests, relative to Base(path): "." for a file
// or a folder format read as one model (ZeRO, DCP), else each checkpoint file and DCP folder.
std::vector<std::string> TensorUnits(const std::string& path) {
  Container kind = ContainerOf(path);
  if (kind != Container::kModelFolder) return {fs::is_directory(path) ? "." : Walk(path).files[0]};
  std::vector<std::string> dcp;
  std::vector<std::string> units;
  for (const std::string& f : ExpandInputs({path}, nullptr, &dcp)) {
    std::string rel = fs::path(f).lexically_relative(path).generic_string();
    if (!Ignored(rel)) units.push_back(rel);
  }
  for (const std::string& d : dcp)
    units.push_back(fs::path(d).lexically_relative(path).generic_string());
  std::sort(units.begin(), units.end());
  return units;
}

Json ReadManifest(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) Fail("{}: cannot read the manifest", file);
  std::stringstream ss;
  ss << in.rdbuf();
  Json j;
  try {
    j = Json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    Fail("{}: not a manifest (not JSON: {})", file, e.what());
  }
  if (!j.is_object() || j.value("format", "") != kFormat || !j.contains("resources") ||
      !j["resources"].is_array())
    Fail("{}: not a {} manifest", file, kFormat);
  return j;
}

void WriteJson(const std::string& file, const Json& j) {
  std::string text = j.dump(1) + "\n";
  AtomicOutput out = AtomicOutput::Create(file, text.size());
  out.Write(0, AsBytes(text));
  out.Commit();
}

std::mutex g_hook_mutex;  // one manifest update at a time (files are replaced in parallel)

// The manifests that name `file`: its sidecar, and the folder manifests of the folders above
// it; with the name each gives the file.
std::vector<std::pair<std::string, std::string>> Covering(const std::string& file) {
  std::vector<std::pair<std::string, std::string>> out;
  fs::path abs = fs::absolute(file).lexically_normal();
  std::error_code ec;
  if (fs::exists(abs.string() + kManifestSuffix, ec))
    out.emplace_back(abs.string() + kManifestSuffix, abs.filename().string());
  for (fs::path dir = abs.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    fs::path m = dir / kManifestName;
    if (fs::exists(m, ec))
      out.emplace_back(m.string(), abs.lexically_relative(dir).generic_string());
    if (dir == dir.parent_path()) break;
  }
  return out;
}

const Json* ResourceNamed(const Json& j, const std::string& name) {
  for (const Json& r : j["resources"]) {
    if (r.value("name", "") == name) return &r;
  }
  return nullptr;
}

void BeforeReplace(const std::string& file) {
  if (IsManifestName(fs::path(file).filename().string())) return;
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  for (const auto& [manifest, name] : Covering(file)) {
    Json j = ReadManifest(manifest);
    const Json* r = ResourceNamed(j, name);
    if (!r) continue;
    if (Sha256OfFile(file) != r->value("digest", ""))
      Fail(
          "{}: its SHA-256 differs from the one {} holds: the file changed since the manifest "
          "was written; refusing a damaged input (run ckptool verify)",
          file, manifest);
  }
}

// After a file is put in place: every manifest naming it gets its new SHA-256 and size (and its
// unit's tensor digests); a folder manifest above a new file (convert's SRC/bf16/, a file
// written into a checkpoint folder) records it, so that verify does not report as added what
// ckptool itself wrote from verified bytes.
void AfterReplace(const std::string& file) {
  if (IsManifestName(fs::path(file).filename().string())) return;
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  for (const auto& covering : Covering(file)) {
    // References, not structured bindings: the lambdas below capture them (clang before 16
    // cannot capture a binding).
    const std::string& manifest = covering.first;
    const std::string& name = covering.second;
    try {
      Json j = ReadManifest(manifest);
      bool named = false;
      for (Json& r : j["resources"]) {
        if (r.value("name", "") != name) continue;
        r["digest"] = Sha256OfFile(file);
        r["size"] = fs::file_size(file);
        named = true;
      }
      if (!named) {
        if (fs::path(manifest).filename().string() != kManifestName) continue;
        // A file of a folder being built (a temp folder renamed into place later: reshard,
        // strip of a DCP folder, sharded export) is not recorded under its temp name.
        bool in_temp = false;
        for (const fs::path& part : fs::path(name)) in_temp |= IsTempFileName(part.string());
        if (in_temp) continue;
        Json& list = j["resources"];
        Json entry = {{"name", name},
                      {"algorithm", "sha256"},
                      {"digest", Sha256OfFile(file)},
                      {"size", fs::file_size(file)}};
        auto at = std::find_if(list.begin(), list.end(),
                               [&](const Json& r) { return r.value("name", "") > name; });
        list.insert(at, std::move(entry));
        WriteJson(manifest, j);
        continue;
      }
      // The tensors of the unit holding the file, digested again (convert changes them).
      if (j.contains("tensors")) {
        std::string base = fs::path(manifest).parent_path().string();
        bool sidecar = fs::path(manifest).filename().string() != kManifestName;
        for (Json& unit : j["tensors"]) {
          std::string of = unit.value("of", "");
          bool holds = of == name || of == "." ||
                       (name.starts_with(of + "/") && fs::is_directory(Join(base, of)));
          if (!holds) continue;
          std::string at = of == "." ? (sidecar ? file : base) : Join(base, of);
          std::vector<std::string> notes;
          uint64_t n = 0;
          unit["digests"] = DigestsOf(at, 1, &notes, &n);
        }
      }
      WriteJson(manifest, j);
    } catch (const Error& e) {
      std::error_code ec;
      fs::remove(manifest, ec);
      Fail(
          "{}: replaced, but its manifest {} could not be brought up to date ({}): removed "
          "rather than left stale; run ckptool manifest again",
          file, manifest, e.what());
    }
  }
}

// After a file is deleted on purpose: the folder manifests above it no longer name it, and its
// own sidecar goes with it.
void AfterRemove(const std::string& file) {
  if (IsManifestName(fs::path(file).filename().string())) return;
  std::lock_guard<std::mutex> lock(g_hook_mutex);
  std::error_code ec;
  fs::remove(file + kManifestSuffix, ec);
  for (const auto& covering : Covering(file)) {
    // References, not structured bindings: the lambdas below capture them (clang before 16
    // cannot capture a binding).
    const std::string& manifest = covering.first;
    const std::string& name = covering.second;
    try {
      Json j = ReadManifest(manifest);
      Json& list = j["resources"];
      auto gone = std::remove_if(list.begin(), list.end(),
                                 [&](const Json& r) { return r.value("name", "") == name; });
      if (gone == list.end()) continue;
      list.erase(gone, list.end());
      if (j.contains("tensors")) {
        Json& units = j["tensors"];
        units.erase(std::remove_if(units.begin(), units.end(),
                                   [&](const Json& u) { return u.value("of", "") == name; }),
                    units.end());
      }
      WriteJson(manifest, j);
    } catch (const Error& e) {
      fs::remove(manifest, ec);
      Fail(
          "{}: deleted, but its manifest {} could not be brought up to date ({}): removed "
          "rather than left stale; run ckptool manifest again",
          file, manifest, e.what());
    }
  }
}

}  // namespace

void RecordFolderWritten(const std::string& folder) {
  std::error_code ec;
  std::vector<std::string> files;
  for (fs::recursive_directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->is_regular_file(ec) && !it->is_symlink(ec)) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& f : files) AfterReplace(f);
}

std::string ManifestPathOf(const std::string& path) {
  if (fs::is_directory(path)) return (fs::path(path) / kManifestName).string();
  return path + kManifestSuffix;
}

bool HasManifest(const std::string& path) {
  std::error_code ec;
  return fs::exists(ManifestPathOf(path), ec);
}

std::vector<std::string> ManifestedAt(const std::string& path) {
  std::vector<std::string> out;
  if (HasManifest(path)) out.push_back(path);
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(path, ec))) return out;
  for (auto it = fs::recursive_directory_iterator(path, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (IsTempFileName(name) || name == ".git") {
      if (it->is_directory(ec) && !it->is_symlink(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink(ec) || !it->is_regular_file(ec)) continue;
    if (name == kManifestName) {
      std::string folder = it->path().parent_path().string();
      if (!fs::equivalent(folder, path, ec)) out.push_back(folder);
    } else if (name.ends_with(kManifestSuffix)) {
      std::string file = it->path().string();
      file.resize(file.size() - std::string_view(kManifestSuffix).size());
      out.push_back(file);  // gone or not: verify says which
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string TensorDigest(const LogicalTensor& t) {
  Sha256 h;
  std::string header = fmt::format("{}{}\n", torch::Name(t.dtype), ShapeText(t.shape));
  h.Update(AsBytes(header));
  if (t.numel == 0) return h.HexDigest();
  if (t.stored != t.dtype && t.dtype != torch::DType::kFloat32)
    Fail("{}: stored as {}, read as {}", t.name, torch::Name(t.stored), torch::Name(t.dtype));
  std::vector<float> wide;
  t.read(0, t.numel, [&](Bytes span) {
    CheckInterrupt();
    if (t.stored == t.dtype) {
      h.Update(span);
      return;
    }
    size_t n = span.size() / torch::ElementSize(t.stored);
    wide.resize(n);
    ToFloat32(t.stored, span.data(), wide.data(), n);
    h.Update(Bytes(reinterpret_cast<const uint8_t*>(wide.data()), n * 4));
  });
  return h.HexDigest();
}

ManifestResult WriteManifest(const std::string& path, const ManifestOptions& o) {
  ManifestResult r;
  r.checkpoint = path;
  r.manifest = ManifestPathOf(path);
  std::error_code ec;
  if (!fs::exists(path, ec)) Fail("{}: no such file or folder", path);
  r.replaced = fs::exists(r.manifest, ec);
  if (r.replaced && !o.force) Fail("{}: exists (use --force to write it again)", r.manifest);
  // Digests vouch for bytes: only for bytes that pass every check their formats carry, and,
  // when a manifest is there already, that still match it (FindDamage checks both).
  RefuseDamaged(path, o.threads, "no manifest written");
  const std::string base = Base(path);
  Tree tree = Walk(path);
  std::vector<std::string> digests(tree.files.size());
  std::vector<uint64_t> sizes(tree.files.size());
  Json units = Json::array();
  // The files' SHA-256s and the tensors' digests side by side: one file's SHA-256 is one
  // thread's work, and the tensors read the pages that hashing the file brings in.
  ParallelFor(o.tensors ? 2 : 1, 2, [&](size_t part) {
    if (part == 0) {
      ParallelFor(tree.files.size(), o.threads, [&](size_t i) {
        std::string file = Join(base, tree.files[i]);
        sizes[i] = fs::file_size(file);
        digests[i] = Sha256OfFile(file);
      });
      return;
    }
    for (const std::string& unit : TensorUnits(path)) {
      std::string at = unit == "." ? path : Join(base, unit);
      Json digests_of;
      try {
        digests_of = DigestsOf(at, o.threads, &r.notes, &r.tensors);
      } catch (const Error& e) {
        r.notes.push_back(fmt::format("{}: no tensor digests ({})", at, e.what()));
        continue;
      }
      units.push_back({{"of", unit},
                       {"digest",
                        "sha256 of \"<dtype>[<shape>]\\n\" and the row-major "
                        "little-endian elements"},
                       {"digests", std::move(digests_of)}});
    }
  });
  Json resources = Json::array();
  for (size_t i = 0; i < tree.files.size(); ++i) {
    resources.push_back({{"name", tree.files[i]},
                         {"algorithm", "sha256"},
                         {"digest", digests[i]},
                         {"size", sizes[i]}});
    r.bytes += sizes[i];
  }
  r.files = tree.files.size();
  Json links = Json::object();
  for (const auto& [rel, target] : tree.symlinks) links[rel] = target;
  Json ignore = Json::array();
  for (const char* g : kGitPaths) ignore.push_back(g);
  ignore.push_back(fs::path(r.manifest).filename().string());
  Json j = {{"format", kFormat},
            {"serialization",
             {{"method", "files"},
              {"hash_type", "sha256"},
              {"allow_symlinks", false},
              {"ignore_paths", ignore}}},
            {"resources", resources},
            {"symlinks", links}};
  if (o.tensors) j["tensors"] = std::move(units);
  WriteJson(r.manifest, j);
  return r;
}

std::vector<torch::Problem> CheckManifest(const std::string& path, unsigned threads,
                                          uint64_t* bytes, bool digests) {
  std::vector<torch::Problem> problems;
  const std::string manifest = ManifestPathOf(path);
  std::error_code ec;
  if (!fs::exists(manifest, ec)) return problems;
  const std::string mname = fs::path(manifest).filename().string();
  Json j;
  try {
    j = ReadManifest(manifest);
  } catch (const Error& e) {
    return {{mname, e.what()}};
  }
  const std::string base = Base(path);
  std::map<std::string, const Json*> named;
  for (const Json& r : j["resources"]) named[r.value("name", "")] = &r;
  Tree tree = Walk(path);
  std::vector<std::string> present;
  for (const std::string& f : tree.files) {
    if (!named.count(f)) {
      problems.push_back({f, fmt::format("not in {} (added after it was written)", mname)});
    } else {
      present.push_back(f);
    }
  }
  for (const auto& [name, r] : named) {
    if (!std::binary_search(tree.files.begin(), tree.files.end(), name))
      problems.push_back({name, fmt::format("missing: {} names it", mname)});
  }
  std::vector<std::string> found(present.size());
  std::vector<uint64_t> sizes(present.size());
  ParallelFor(present.size(), threads, [&](size_t i) {
    std::string file = Join(base, present[i]);
    sizes[i] = fs::file_size(file);
    if (sizes[i] != named[present[i]]->value("size", sizes[i])) return;  // said below
    found[i] = digests ? Sha256OfFile(file) : named[present[i]]->value("digest", "");
  });
  for (size_t i = 0; i < present.size(); ++i) {
    const Json& r = *named[present[i]];
    uint64_t want = r.value("size", sizes[i]);
    if (sizes[i] != want) {
      problems.push_back({present[i], fmt::format("{} bytes where {} says {}: the file changed "
                                                  "(cut or grown) since it was written",
                                                  sizes[i], mname, want)});
    } else if (found[i] != r.value("digest", "")) {
      problems.push_back({present[i], fmt::format("its SHA-256 differs from the one {} holds: "
                                                  "its bytes changed since it was written",
                                                  mname)});
    }
    if (bytes) *bytes += sizes[i];
  }
  std::map<std::string, std::string> links;
  for (const auto& [rel, target] : tree.symlinks) links[rel] = target;
  if (j.contains("symlinks") && j["symlinks"].is_object()) {
    for (const auto& [rel, target] : j["symlinks"].items()) {
      auto it = links.find(rel);
      if (it == links.end()) {
        problems.push_back({rel, fmt::format("missing: {} names it (a link to {})", mname,
                                             target.get<std::string>())});
      } else if (it->second != target.get<std::string>()) {
        problems.push_back({rel, fmt::format("links to {} where {} says {}", it->second, mname,
                                             target.get<std::string>())});
      }
    }
  }
  std::sort(problems.begin(), problems.end(),
            [](const torch::Problem& a, const torch::Problem& b) { return a.where < b.where; });
  return problems;
}

void InstallManifestHooks() {
  SetReplaceHooks(&BeforeReplace, &AfterReplace);
  SetRemoveHook(&AfterRemove);
}

}  // namespace ckpt
