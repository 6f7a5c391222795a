// A .ckz archive (compress/archive.h): described from its index without decoding, verified
// chunk by chunk; the checkpoints it holds are described and verified as they would be once
// restored, read in place through the archive's volume (checkpoint/archive_view.h) and named
// "<archive>: <path inside>".
#include <fmt/format.h>

#include <memory>
#include <optional>

#include "base/error.h"
#include "base/human.h"
#include "checkpoint/archive_restore.h"
#include "checkpoint/archive_view.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_kinds.h"
#include "compress/archive.h"
#include "reports/archive_report.h"

namespace ckpt::kinds {

namespace {

// The checkpoints an archive holds, opened in place: its files, its DCP folders and, when it
// holds a ZeRO folder, that folder as one model.
struct Held {
  std::unique_ptr<ArchiveView> view;
  std::vector<std::unique_ptr<Checkpoint>> files, dcp;
  std::unique_ptr<Checkpoint> zero;
};

class ArchiveCheckpoint : public Checkpoint {
 public:
  explicit ArchiveCheckpoint(const std::string& path) : Checkpoint(path) {}

  Container kind() const override { return Container::kArchive; }

  void DescribeText(const DescribeOptions& o,
                    const std::function<void(const std::string&)>& print) const override {
    print(RenderArchiveText(ckz::Archive::Open(path()), o.top));
    Held held = Open(o.threads);
    auto each = [&](const Checkpoint& c) {
      try {
        c.DescribeText(o, print);
      } catch (const InputChanged&) {
        throw;
      } catch (const Error& e) {
        Said(o, held.view->Rename(e.what(), path() + ": "));
      }
    };
    for (const auto& f : held.files) each(*f);
    for (const auto& d : held.dcp) each(*d);
  }

  void DescribeJson(JsonStream& out, const DescribeOptions& o) const override {
    ckz::Archive a = ckz::Archive::Open(path());
    Held held = Open(o.threads);
    WriteArchiveJson(out, a, [&](JsonStream& j) {
      // "checkpoints": the held files' reports, as "files" would hold them once restored.
      j.BeginArray("checkpoints");
      for (const auto& f : held.files) {
        size_t depth = j.depth();
        try {
          f->DescribeJson(j, o);
        } catch (const InputChanged&) {
          throw;
        } catch (const Error& e) {        // reported like a file inspect cannot read
          if (j.depth() != depth) throw;  // an object half written: nothing sane to add
          std::string what = held.view->Rename(e.what(), path() + ": ");
          Said(o, what);
          j.Value({{"path", f->name()}, {"error", what}});
        }
      }
      j.End();
      if (!held.dcp.empty()) {
        j.BeginArray("dcp");
        for (const auto& d : held.dcp) d->DescribeJson(j, o);
        j.End();
      }
    });
  }

  // Every chunk decoded and its checksum checked, in parallel; then the checkpoints it holds,
  // verified as they would be once restored (what torch.load of them would run is what
  // matters).
  VerifyOutcome Verify(unsigned threads, const torch::Trust& trust, bool checksums) const override {
    ckz::Archive a = ckz::Archive::Open(path());
    if (!checksums) {
      // Structure: the index read and every chunk within the file (Archive::Open checks
      // both); nothing decoded.
      return VerifyOutcome{{},
                           fmt::format("{}: OK (ckz archive: {}, structure only: index and "
                                       "chunk extents, nothing decoded)",
                                       path(), Count(a.index().entries.size(), "entry")),
                           {}};
    }
    ArchiveVerifyResult r = VerifyArchive(a, threads);
    VerifyOutcome out{std::move(r.problems),
                      fmt::format("{}: OK (ckz archive: {}, {} decoded, {} CRC-checked", path(),
                                  Count(a.index().entries.size(), "entry"),
                                  Count(r.chunks, "chunk"), HumanBytes(r.bytes)),
                      {}};
    if (!out.problems.empty()) return out;
    Held held = Open(threads);
    // Problems and notes are named by the path inside the archive, never the temp folder.
    auto check = [&](const Checkpoint& inside) {
      std::string rel = held.view->Relative(inside.path());
      try {
        VerifyOutcome v = inside.Verify(threads, trust, checksums);
        for (torch::Problem& p : v.problems) {
          p.where = p.where.empty() ? rel : fmt::format("{}: {}", rel, p.where);
          out.problems.push_back(std::move(p));
        }
        for (std::string& n : v.notes) out.notes.push_back(rel + ": " + n);
      } catch (const InputChanged&) {
        throw;
      } catch (const Error& e) {
        std::string what = e.what();
        if (what.starts_with(inside.path() + ": ")) what = what.substr(inside.path().size() + 2);
        // A message naming another path inside (a ZeRO tag folder): that path is its place.
        std::string renamed = held.view->Rename(what, "");
        size_t colon = renamed.find(": ");
        if (renamed != what && colon != std::string::npos) {
          out.problems.push_back({renamed.substr(0, colon), renamed.substr(colon + 2)});
        } else {
          out.problems.push_back({rel, renamed});
        }
      }
    };
    for (const auto& f : held.files) check(*f);
    // A DeepSpeed ZeRO folder: its partitions must also add up, as verify of the folder says.
    if (held.zero) check(*held.zero);
    for (const auto& d : held.dcp) check(*d);
    out.ok += fmt::format("; {} inside verified as restored{})",
                          Count(held.files.size() + held.dcp.size(), "checkpoint"),
                          held.zero ? ", the ZeRO partitions add up" : "");
    return out;
  }

 private:
  Held Open(unsigned threads) const {
    Held h;
    h.view = ArchiveView::Open(path(), threads);
    auto named = [&](const Located& l) {
      std::unique_ptr<Checkpoint> c = CheckpointAt(l);
      c->set_name(path() + ": " + h.view->Relative(c->path()));
      return c;
    };
    for (const Located& l : h.view->Checkpoints()) {
      switch (l.kind) {
        case Container::kZero:
          h.zero = named(l);
          break;
        case Container::kDcp:
          h.dcp.push_back(named(l));
          break;
        case Container::kFile:
        case Container::kModelFolder:
        case Container::kArchive:  // an archive inside an archive is only a file here
          h.files.push_back(named({Container::kFile, l.path, l.volume}));
          break;
      }
    }
    return h;
  }

  static void Said(const DescribeOptions& o, const std::string& what) {
    if (o.error) o.error(what);
  }
};

}  // namespace

std::unique_ptr<Checkpoint> OpenArchive(const std::string& path) {
  return std::make_unique<ArchiveCheckpoint>(path);
}

}  // namespace ckpt::kinds
