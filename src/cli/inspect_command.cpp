#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <unordered_map>

#include "base/error.h"
#include "cli/commands.h"
#include "compress/archive.h"
#include "dcp/dcp_checkpoint.h"
#include "deepspeed/zero_checkpoint.h"
#include "ops/compress.h"
#include "ops/dcp_report.h"
#include "ops/inspect_output.h"
#include "ops/zero_report.h"

namespace ckpt::cli {

namespace {

namespace fs = std::filesystem;

struct InspectCliOptions {
  std::vector<std::string> paths;
  bool json = false;
  size_t top = 20;
};

int RunInspect(const InspectCliOptions& o) {
  int rc = 0;
  // .ckz archives (ckptool compress) are described from their index, without decoding.
  std::vector<std::string> archives, paths;
  for (const std::string& p : o.paths) (ckz::IsArchiveFile(p) ? archives : paths).push_back(p);
  std::vector<std::string> dcp_folders;
  std::vector<std::string> files = ExpandInputs(paths, nullptr, &dcp_folders);
  if (files.empty() && dcp_folders.empty() && archives.empty()) {
    PrintError("no checkpoint files found in the given paths");
    return 1;
  }
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  bool first = true;
  for (const std::string& path : archives) {
    try {
      ckz::Archive a = ckz::Archive::Open(path);
      if (o.json) {
        doc["archives"].push_back(RenderArchiveJson(a));
      } else {
        if (!first) std::cout << "\n";
        std::cout << RenderArchiveText(a, o.top);
        first = false;
      }
    } catch (const Error& e) {
      PrintError(e.what());
      if (o.json) doc["archives"].push_back({{"path", path}, {"error", e.what()}});
      rc = 1;
    }
  }
  // DeepSpeed ZeRO checkpoints are read first, each also described as the one model its rank
  // files make: every rank file is described as that reader parses it, so it is not parsed a
  // second time below (printed in the same order as if it were).
  std::unordered_map<std::string, FileReport> described;  // by lexically normal path
  auto key = [](const std::string& p) { return fs::path(p).lexically_normal().string(); };
  struct ZeroOut {
    std::string path, text, error;
    nlohmann::ordered_json json;
  };
  std::vector<ZeroOut> zeros;
  for (const std::string& path : paths) {
    if (!deepspeed::LooksLikeZeroCheckpoint(path)) continue;
    ZeroOut& out = zeros.emplace_back(ZeroOut{path, {}, {}, {}});
    try {
      deepspeed::ZeroCheckpoint z =
          deepspeed::OpenZeroCheckpoint(path, "", [&](const CheckpointFile& f) {
            try {
              described.insert_or_assign(key(f.path), BuildReport(f, o.json ? SIZE_MAX : o.top));
            } catch (const Error&) {
              // Described (with its error) when the file is read on its own below.
            }
          });
      if (o.json) {
        out.json = RenderZeroJson(z);
      } else {
        out.text = RenderZeroText(z, o.top);
      }
    } catch (const Error& e) {
      out.error = e.what();
    }
  }
  for (const std::string& path : files) {
    try {
      auto it = described.find(key(path));
      FileReport r;
      if (it != described.end()) {
        r = std::move(it->second);
        r.path = path;
        described.erase(it);
      } else {
        CheckpointFile f = OpenCheckpoint(path);
        // Text lists the largest o.top rows; JSON every row.
        r = BuildReport(f, o.json ? SIZE_MAX : o.top);
      }
      if (o.json) {
        doc["files"].push_back(RenderJson(r));
      } else {
        if (!first) std::cout << "\n";
        std::cout << RenderText(r, o.top);
        first = false;
      }
    } catch (const Error& e) {
      PrintError(e.what());
      if (o.json) doc["files"].push_back({{"path", path}, {"error", e.what()}});
      rc = 1;
    }
  }
  for (ZeroOut& z : zeros) {
    if (!z.error.empty()) {
      PrintError(z.error);
      if (o.json) doc["zero"].push_back({{"folder", z.path}, {"error", z.error}});
      rc = 1;
    } else if (o.json) {
      doc["zero"].push_back(std::move(z.json));
    } else {
      std::cout << "\n" << z.text;
    }
  }
  // A torch.distributed.checkpoint folder is one checkpoint made of chunk items.
  for (const std::string& folder : dcp_folders) {
    try {
      dcp::Checkpoint c = dcp::OpenDcp(folder);
      if (o.json) {
        doc["dcp"].push_back(RenderDcpJson(c));
      } else {
        if (!first) std::cout << "\n";
        std::cout << RenderDcpText(c, o.top);
        first = false;
      }
    } catch (const Error& e) {
      PrintError(e.what());
      if (o.json) doc["dcp"].push_back({{"folder", folder}, {"error", e.what()}});
      rc = 1;
    }
  }
  if (o.json) PrintJson(doc);
  return rc;
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
  return [o] { return RunInspect(*o); };
}

}  // namespace ckpt::cli
