#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <unordered_map>

#include "base/error.h"
#include "cli/commands.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "io/parallel.h"
#include "ops/archive_view.h"
#include "ops/compress.h"
#include "ops/dcp_report.h"
#include "ops/discovery.h"
#include "ops/inspect_output.h"
#include "ops/zero_report.h"

namespace ckpt::cli {

namespace {

namespace fs = std::filesystem;

struct InspectCliOptions {
  std::vector<std::string> paths;
  bool json = false;
  size_t top = 20;
  std::vector<std::string> trust;
};

// What inspect was given: .ckz archives (described from their index, without decoding),
// checkpoint files, DeepSpeed ZeRO folders (also described as the one model their rank files
// make) and torch.distributed.checkpoint folders (one checkpoint made of chunk items).
struct Inputs {
  std::vector<std::string> archives, files, zero, dcp;
};

// The checkpoints a .ckz archive holds, read in place through its skeleton
// (ops/archive_view.h): each file's report and each DCP folder's, named "<archive>: <path
// inside>", as inspect of the restored checkpoint would give them.
struct Held {
  std::unique_ptr<ArchiveView> view;
  std::vector<std::string> files, dcp;
  std::string Name(const std::string& archive, const std::string& path) const {
    return archive + ": " + view->Relative(path);
  }
  dcp::Checkpoint OpenDcp(const std::string& archive, const std::string& folder) const {
    dcp::Checkpoint c = dcp::OpenDcp(folder);
    c.folder = Name(archive, folder);
    return c;
  }
};

Held OpenHeld(const std::string& archive) {
  Held h;
  h.view = ArchiveView::Open(archive, ReadOnlyTempParent(), DefaultThreads());
  h.files = h.view->Checkpoints(&h.dcp);
  return h;
}

// Text: each checkpoint's report as it is read; a ZeRO folder's rank files are described from
// the parse its reader makes of them (not parsed a second time), printed in the same order as
// if they were read on their own.
int InspectText(const InspectCliOptions& o, const Inputs& in) {
  int rc = 0;
  bool first = true;
  auto print = [&](const std::string& text) {
    if (!first) Out() << "\n";
    Out() << text;
    first = false;
  };
  for (const std::string& path : in.archives) {
    try {
      print(RenderArchiveText(ckz::Archive::Open(path), o.top));
      Held held = OpenHeld(path);
      auto each = [&](const std::string& p, auto describe) {
        try {
          print(describe(p));
        } catch (const InputChanged&) {
          throw;
        } catch (const Error& e) {
          PrintError(held.view->Rename(e.what(), path + ": "));
          rc = 1;
        }
      };
      for (const std::string& f : held.files) {
        each(f, [&](const std::string& p) {
          FileReport r = BuildReport(OpenCheckpoint(p), o.top, torch::Trust{o.trust});
          r.path = held.Name(path, p);
          return RenderText(r, o.top);
        });
      }
      for (const std::string& d : held.dcp) {
        each(d, [&](const std::string& p) { return RenderDcpText(held.OpenDcp(path, p), o.top); });
      }
    } catch (const Error& e) {
      PrintError(e.what());
      rc = 1;
    }
  }
  std::unordered_map<std::string, FileReport> described;  // by lexically normal path
  auto key = [](const std::string& p) { return fs::path(p).lexically_normal().string(); };
  struct ZeroOut {
    std::string text, error;
  };
  std::vector<ZeroOut> zeros;
  for (const std::string& path : in.zero) {
    ZeroOut& out = zeros.emplace_back();
    try {
      deepspeed::ZeroCheckpoint z =
          deepspeed::OpenZeroCheckpoint(path, "", [&](const CheckpointFile& f) {
            try {
              described.insert_or_assign(key(f.path), BuildReport(f, o.top, torch::Trust{o.trust}));
            } catch (const Error&) {
              // Described (with its error) when the file is read on its own below.
            }
          });
      out.text = RenderZeroText(z, o.top);
    } catch (const Error& e) {
      out.error = e.what();
    }
  }
  for (const std::string& path : in.files) {
    try {
      auto it = described.find(key(path));
      FileReport r;
      if (it != described.end()) {
        r = std::move(it->second);
        r.path = path;
        described.erase(it);
      } else {
        r = BuildReport(OpenCheckpoint(path), o.top,
                        torch::Trust{o.trust});  // the largest o.top rows
      }
      print(RenderText(r, o.top));
    } catch (const Error& e) {
      PrintError(e.what());
      rc = 1;
    }
  }
  for (const ZeroOut& z : zeros) {
    if (!z.error.empty()) {
      PrintError(z.error);
      rc = 1;
    } else {
      Out() << "\n" << z.text;
    }
  }
  for (const std::string& folder : in.dcp) {
    try {
      print(RenderDcpText(dcp::OpenDcp(folder), o.top));
    } catch (const Error& e) {
      PrintError(e.what());
      rc = 1;
    }
  }
  return rc;
}

// JSON: one document {"files": [...], "archives": [...], "zero": [...], "dcp": [...]} (keys
// after "files" only when there is something under them), written as each checkpoint is
// described and then freed: every row of every file, yet memory bounded by one checkpoint.
int InspectJson(const InspectCliOptions& o, const Inputs& in) {
  int rc = 0;
  std::ostream& os = Out();
  JsonStream out([&os](std::string_view text) { os.write(text.data(), text.size()); });
  out.BeginObject();
  // One array per key; `each` describes an input into the stream or throws.
  auto section = [&](std::string_view name, const std::vector<std::string>& items,
                     std::string_view path_key, auto each, bool always) {
    if (items.empty() && !always) return;
    out.BeginArray(name);
    for (const std::string& item : items) {
      size_t depth = out.depth();
      try {
        each(item);
      } catch (const Error& e) {
        if (out.depth() != depth) throw;  // an object half written: nothing sane to add
        PrintError(e.what());
        out.Value({{std::string(path_key), item}, {"error", e.what()}});
        rc = 1;
      }
    }
    out.End();
  };
  section(
      "files", in.files, "path",
      [&](const std::string& path) {
        FileReport r =
            BuildReport(OpenCheckpoint(path), SIZE_MAX, torch::Trust{o.trust});  // every row
        WriteJson(out, r);
      },
      true);
  section(
      "archives", in.archives, "path",
      [&](const std::string& path) {
        ckz::Archive a = ckz::Archive::Open(path);
        Held held = OpenHeld(path);
        WriteArchiveJson(out, a, [&](JsonStream& j) {
          // "checkpoints": the held files' reports, as "files" would hold them once restored.
          j.BeginArray("checkpoints");
          for (const std::string& f : held.files) {
            std::optional<FileReport> r;
            try {
              r = BuildReport(OpenCheckpoint(f), SIZE_MAX, torch::Trust{o.trust});
            } catch (const InputChanged&) {
              throw;
            } catch (const Error& e) {  // reported like a file inspect cannot read
              std::string what = held.view->Rename(e.what(), path + ": ");
              PrintError(what);
              j.Value({{"path", held.Name(path, f)}, {"error", what}});
              rc = 1;
              continue;
            }
            r->path = held.Name(path, f);
            WriteJson(j, *r);
          }
          j.End();
          if (!held.dcp.empty()) {
            j.BeginArray("dcp");
            for (const std::string& d : held.dcp) WriteDcpJson(j, held.OpenDcp(path, d));
            j.End();
          }
        });
      },
      false);
  section(
      "zero", in.zero, "folder",
      [&](const std::string& path) { WriteZeroJson(out, deepspeed::OpenZeroCheckpoint(path)); },
      false);
  section(
      "dcp", in.dcp, "folder",
      [&](const std::string& folder) { WriteDcpJson(out, dcp::OpenDcp(folder)); }, false);
  out.End();
  out.Flush();
  Out() << "\n";
  return rc;
}

int RunInspect(const InspectCliOptions& o) {
  Inputs in;
  for (Located& l : Locate(o.paths)) {
    switch (l.kind) {
      case Container::kArchive:
        in.archives.push_back(std::move(l.path));
        break;
      case Container::kFile:
      case Container::kModelFolder:  // (Locate walks folders into their files)
        in.files.push_back(std::move(l.path));
        break;
      case Container::kZero:
        in.zero.push_back(std::move(l.path));
        break;
      case Container::kDcp:
        in.dcp.push_back(std::move(l.path));
        break;
    }
  }
  if (in.files.empty() && in.dcp.empty() && in.archives.empty()) {
    PrintError("no checkpoint files found in the given paths");
    return 1;
  }
  return o.json ? InspectJson(o, in) : InspectText(o, in);
}

}  // namespace

Runner AddInspect(CLI::App& app) {
  auto o = std::make_shared<InspectCliOptions>();
  app.add_option("paths", o->paths,
                 "Checkpoint files or folders (folders: every checkpoint "
                 "file inside, recognised by content)")
      ->required();
  app.add_flag("--json", o->json, "Print one JSON document");
  app.add_option("-n,--top", o->top, "Rows in the largest-tensor and rollup tables")
      ->capture_default_str();
  AddTrustFlag(app, &o->trust);
  return [o] { return RunInspect(*o); };
}

}  // namespace ckpt::cli
