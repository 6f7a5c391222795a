#include "engines/dcp_strip.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <stdio.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/names.h"
#include "checkpoint/manifest.h"
#include "dcp/dcp_checkpoint.h"
#include "io/atomic_output.h"
#include "io/file_copy.h"
#include "io/folders.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "io/temp_files.h"
#include "pickle/writer.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

using pickle::Graph;
using pickle::Kind;
using pickle::NodeId;

// The shortest dotted prefix of `fqn` (the fqn itself included) the drop rule selects, or ""
// when it stays. A prefix a keep glob names, or below which a keep glob may match, keeps it.
std::string DropPrefix(const std::string& fqn, const StripOptions& o) {
  if (MatchesAnyGlob(o.keep, fqn)) return "";
  for (size_t end = fqn.find('.');; end = fqn.find('.', end + 1)) {
    std::string prefix = fqn.substr(0, end);
    if (MatchesAnyGlob(o.keep, prefix)) return "";
    bool drop = o.drop.empty()
                    ? end == fqn.find('.') &&
                          std::find(OptimizerStateKeys().begin(), OptimizerStateKeys().end(),
                                    prefix) != OptimizerStateKeys().end()
                    : MatchesAnyGlob(o.drop, prefix);
    if (drop) return prefix;
    if (end == std::string::npos) return "";
  }
}

void ReplaceInt(Graph& g, NodeId obj_state, std::string_view field, uint64_t value) {
  std::span<const NodeId> pairs = g.pairs(obj_state);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (g.kind(pairs[i]) == Kind::kStr && g.text(pairs[i]) == field) {
      NodeId v = g.AddInt(static_cast<int64_t>(value));
      g.mutable_pairs(obj_state)[i + 1] = v;
      return;
    }
  }
  Fail("internal: no field '{}' to rewrite", field);
}

// Keeps the pairs of dict `d` whose key `keep` accepts.
template <typename Keep>
void FilterDict(Graph& g, NodeId d, Keep keep) {
  if (d == pickle::kNil || g.kind(d) != Kind::kDict) return;
  std::span<const NodeId> pairs = g.pairs(d);
  std::vector<NodeId> kept;
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    if (keep(pairs[i])) {
      kept.push_back(pairs[i]);
      kept.push_back(pairs[i + 1]);
    }
  }
  g.SetPairs(d, kept);
}

}  // namespace

StripResult StripDcp(const std::string& folder, const StripOptions& o) {
  dcp::Checkpoint c = dcp::OpenDcp(folder, o.trust);
  StripResult r;
  r.path = folder;
  r.output = o.output.empty() ? folder : o.output;
  if (!c.problems.empty()) {
    Fail("{}: {}: {} ({} problem(s) in all; run ckptool verify)", folder, c.problems[0].where,
         c.problems[0].what, c.problems.size());
  }
  for (const torch::UnsafeFinding& u : c.meta.scan.findings)
    Fail("{}: .metadata: the pickle {}; refusing to rewrite it", folder, u.what);
  // What goes.
  const dcp::Metadata& md = c.meta;
  std::unordered_set<std::string> dropped_fqns;
  std::map<std::string, uint64_t> dropped_bytes;  // prefix -> item bytes
  for (const dcp::EntryMeta& e : md.entries) {
    std::string prefix = DropPrefix(e.fqn, o);
    if (!prefix.empty()) {
      dropped_fqns.insert(e.fqn);
      dropped_bytes[prefix];
    }
  }
  for (const dcp::StorageEntry& s : md.storage) {
    if (!dropped_fqns.count(s.fqn)) continue;
    dropped_bytes[DropPrefix(s.fqn, o)] += s.length;
  }
  for (const auto& [prefix, bytes] : dropped_bytes) r.dropped.push_back({prefix, bytes});
  for (const dcp::Object& ob : c.objects) {
    if (dropped_fqns.count(ob.fqn) || o.allow_unsafe_globals) continue;
    for (const torch::UnsafeFinding& u : c.items[static_cast<size_t>(ob.item)].scan.findings)
      Fail("{}: object '{}': the pickle {}; refusing to copy it (--allow-unsafe-globals)", folder,
           ob.fqn, u.what);
  }
  r.before = c.metadata_bytes;
  for (const dcp::DataFile& f : c.files) r.before += f.bytes.size();
  // The new layout: kept items in their order, per file.
  std::vector<std::vector<size_t>> kept_items(c.files.size());
  for (size_t i = 0; i < c.items.size(); ++i) {
    const dcp::Item& item = c.items[i];
    if (!dropped_fqns.count(md.storage[item.entry].fqn))
      kept_items[static_cast<size_t>(item.file)].push_back(i);
  }
  std::vector<uint64_t> new_offset(c.items.size(), 0), new_size(c.files.size(), 0);
  for (size_t f = 0; f < c.files.size(); ++f) {
    auto& v = kept_items[f];
    std::sort(v.begin(), v.end(), [&](size_t a, size_t b) {
      return md.storage[c.items[a].entry].offset < md.storage[c.items[b].entry].offset;
    });
    for (size_t i : v) {
      new_offset[i] = new_size[f];
      new_size[f] += md.storage[c.items[i].entry].length;
    }
  }
  // The new metadata files, the kept items at their new offsets: one .metadata is rewritten
  // in the graph it was read into; per-rank ones (writers without collectives), merged into one
  // view when read, are each parsed again and rewritten alone, one graph at a time.
  std::map<std::pair<std::string, uint64_t>, uint64_t> moved;  // (path, old offset) -> new
  for (size_t i = 0; i < c.items.size(); ++i) {
    const dcp::StorageEntry& s = md.storage[c.items[i].entry];
    if (!dropped_fqns.count(s.fqn)) moved[{s.path, s.offset}] = new_offset[i];
  }
  const bool merged = c.metadata_files.size() != 1;
  if (merged) c.meta.graph = Graph();
  std::vector<std::string> metadata;
  for (const std::string& name : c.metadata_files) {
    dcp::Metadata parsed;
    uint64_t size = c.metadata_bytes;
    if (merged) {
      MappedFile in = MappedFile::Open((fs::path(folder) / name).string());
      parsed = dcp::ParseMetadata(in.bytes());
      size = in.size();
    }
    dcp::Metadata& one = merged ? parsed : c.meta;
    Graph& g = one.graph;
    std::unordered_set<NodeId> infos;
    for (const dcp::StorageEntry& s : one.storage) {
      if (dropped_fqns.count(s.fqn)) continue;
      NodeId state = dcp::StateDict(g, s.info);
      auto it = moved.find({s.path, s.offset});
      if (state == pickle::kNil || it == moved.end() || !infos.insert(state).second)
        Fail("{}: {}: a _StorageInfo shared between items; cannot rewrite it", folder, name);
      ReplaceInt(g, state, "offset", it->second);
    }
    auto fqn_kept = [&](NodeId key) {
      return g.kind(key) != Kind::kStr || !dropped_fqns.count(std::string(g.text(key)));
    };
    FilterDict(g, dcp::Field(g, g.root, "state_dict_metadata"), fqn_kept);
    FilterDict(g, dcp::Field(g, g.root, "planner_data"), fqn_kept);
    FilterDict(g, dcp::Field(g, g.root, "storage_data"), [&](NodeId key) {
      NodeId fqn = dcp::Field(g, key, "fqn");
      return fqn == pickle::kNil || g.kind(fqn) != Kind::kStr ||
             !dropped_fqns.count(std::string(g.text(fqn)));
    });
    pickle::WriteOptions wo;
    wo.protocol = std::max(2, g.protocol);
    wo.reserve = size;  // what was read: the rewritten stream is about that size
    metadata.push_back(pickle::Write(g, g.root, wo));
  }
  r.after = 0;
  for (const std::string& m : metadata) r.after += m.size();

  for (uint64_t s : new_size) r.after += s;
  std::vector<std::string> others;  // files copied as they are
  std::unordered_set<std::string> data_names;
  for (const dcp::DataFile& f : c.files) data_names.insert(f.name);
  for (const auto& e : fs::directory_iterator(folder)) {
    std::string name = e.path().filename().string();
    if (std::count(c.metadata_files.begin(), c.metadata_files.end(), name) ||
        data_names.count(name) || IsTempFileName(name) || IsManifestName(name))
      continue;
    others.push_back(name);
    std::error_code ec;
    if (e.is_regular_file(ec)) {
      r.before += e.file_size(ec);
      r.after += e.file_size(ec);
    }
  }
  if (dropped_fqns.empty()) {
    r.note = "nothing to drop";
    r.after = r.before;  // the folder stays as it is, byte for byte
    if (!o.dry_run && !o.output.empty()) {
      CopyFolderAtomically(folder, o.output);
      r.output = o.output;
    }
    return r;
  }
  if (o.dry_run) return r;
  // A manifest inside (checkpoint/manifest.h) vouches for these bytes, which carry no checksum of
  // their own: they must still match it before anything is carried over, and a folder stripped in
  // place gets it written anew (a copy elsewhere gets none, as convert -o).
  const bool manifest = HasManifest(folder);
  if (manifest) {
    std::vector<torch::Problem> changed = CheckManifest(folder, o.threads);
    if (!changed.empty())
      Fail(
          "{}: {}: {} ({} problem(s) in all); refusing a damaged input: nothing stripped (run "
          "ckptool verify)",
          folder, changed[0].where, changed[0].what, changed.size());
  }

  // Build the new folder beside its destination.
  fs::path dest = fs::absolute(o.output.empty() ? fs::path(folder) : fs::path(o.output));
  dest = dest.lexically_normal();
  if (dest.filename().empty()) dest = dest.parent_path();
  std::error_code ec;
  if (!o.output.empty() && fs::exists(dest, ec) &&
      !(fs::is_directory(dest, ec) && fs::is_empty(dest, ec)))
    Fail("{}: exists; strip -o writes a new folder", o.output);
  TempFolder tmp{TempPathFor(dest.string())};
  fs::create_directory(tmp.path);
  std::vector<std::pair<uint32_t, uint32_t>> crcs(c.items.size(), {0, 0});  // (old, new)
  for (size_t f = 0; f < c.files.size(); ++f) {
    if (kept_items[f].empty()) continue;
    fs::path path = fs::path(tmp.path) / c.files[f].name;
    fs::create_directories(path.parent_path());
    AtomicOutput out = AtomicOutput::Create(path.string(), new_size[f]);
    out.RequireUnchanged(*c.files[f].map);
    std::vector<uint64_t> sizes;
    for (size_t i : kept_items[f]) sizes.push_back(md.storage[c.items[i].entry].length);
    std::vector<uint32_t> copied =
        ParallelCrc(sizes, o.threads, kCrcPiece, [&](size_t k, uint64_t off, uint64_t len) {
          const dcp::StorageEntry& s = md.storage[c.items[kept_items[f][k]].entry];
          out.CopyFrom(*c.files[f].map, s.offset + off, new_offset[kept_items[f][k]] + off, len);
          return Crc32OfRange(*c.files[f].map, s.offset + off, len);
        });
    for (size_t k = 0; k < copied.size(); ++k) crcs[kept_items[f][k]].first = copied[k];
    out.SetMode(c.files[f].map->mode(), c.files[f].map->uid(), c.files[f].map->gid());
    out.Commit();
  }
  for (size_t k = 0; k < metadata.size(); ++k) {
    AtomicOutput out = AtomicOutput::Create((fs::path(tmp.path) / c.metadata_files[k]).string(),
                                            metadata[k].size());
    out.Write(0, AsBytes(metadata[k]));
    out.SetDefaultMode();
    out.Commit();
  }
  // Other files (Megatron's common.pt, metadata.json) as they are, fsynced like the rest: the
  // old folder goes once the new one is in place. A subfolder keeps the data files written
  // into it above.
  for (const std::string& name : others) {
    fs::path from = fs::path(folder) / name, to = fs::path(tmp.path) / name;
    if (fs::is_regular_file(fs::symlink_status(from))) {
      CopyFileAtomically(MappedFile::Open(from.string()), to.string());
    } else {
      fs::copy(from, to,
               fs::copy_options::recursive | fs::copy_options::copy_symlinks |
                   fs::copy_options::skip_existing);
    }
  }
  fs::permissions(tmp.path, fs::status(folder).permissions(), ec);
  SyncFolder(tmp.path);
  // Of what was read, the read-back needs the storage table alone: the metadata graph, the
  // tensors, the items and the new metadata's bytes go before the new folder is read (at 10^5
  // tensors they would double the peak).
  std::vector<size_t> entry_of(c.items.size());
  for (size_t i = 0; i < c.items.size(); ++i) entry_of[i] = c.items[i].entry;
  c.meta.graph = Graph();
  std::vector<dcp::Tensor>().swap(c.tensors);
  std::vector<dcp::Object>().swap(c.objects);
  std::vector<dcp::Item>().swap(c.items);
  std::vector<std::string>().swap(metadata);
  // Read back: the kept tensors and objects, whole, and every kept item's bytes.
  WithContext(fmt::format("{}: verifying the new folder failed, nothing was replaced", folder),
              [&] {
                dcp::Checkpoint back = dcp::OpenDcp(tmp.path);
                if (!back.problems.empty())
                  Fail("{}: {}", back.problems[0].where, back.problems[0].what);
                size_t expected = md.entries.size() - dropped_fqns.size();
                if (back.tensors.size() + back.objects.size() != expected)
                  Fail("{} entries read back, {} expected",
                       back.tensors.size() + back.objects.size(), expected);
                std::unordered_map<std::string, size_t> file_of;
                for (size_t f = 0; f < back.files.size(); ++f)
                  file_of.emplace(back.files[f].name, f);
                for (size_t f = 0; f < c.files.size(); ++f) {
                  if (kept_items[f].empty()) continue;
                  auto it = file_of.find(c.files[f].name);
                  if (it == file_of.end()) Fail("{} is missing", c.files[f].name);
                  const dcp::DataFile& bf = back.files[it->second];
                  if (!bf.map) Fail("{} is missing", bf.name);
                  CrcChecks reread;
                  for (size_t i : kept_items[f]) {
                    const dcp::StorageEntry& s = md.storage[entry_of[i]];
                    if (new_offset[i] + s.length > bf.bytes.size()) Fail("{} is short", bf.name);
                    reread.Add(new_offset[i], s.length, crcs[i].first, i);
                  }
                  // Read in pieces on every thread (the items were copied by the kernel).
                  reread.Run(*bf.map, o.threads, [&](size_t i) {
                    Fail("the item of '{}' at {} of {} does not hold the bytes copied",
                         md.storage[entry_of[i]].fqn, new_offset[i], bf.name);
                  });
                }
              });
  // Replace.
  if (!o.output.empty()) {
    if (fs::exists(dest, ec)) fs::remove(dest, ec);  // an empty folder
    fs::rename(tmp.path, dest);
    tmp.keep = true;
  } else {
    if (::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, dest.c_str(), RENAME_EXCHANGE) != 0)
      Fail("{}: cannot swap in the new folder: {} (nothing was replaced)", folder,
           std::strerror(errno));
    // tmp.path now holds the old folder; ~TempFolder removes it.
  }
  LogCommitForTests(dest.string());
  SyncFolder(dest.parent_path().string());
  r.rewritten = true;
  if (manifest && o.output.empty()) {
    ManifestOptions mo;
    mo.threads = o.threads;
    WithContext(fmt::format("{}: stripped, but its manifest could not be written anew (run "
                            "ckptool manifest)",
                            folder),
                [&] { WriteManifest(dest.string(), mo); });
  }
  return r;
}

}  // namespace ckpt
