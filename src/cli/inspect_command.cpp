#include <memory>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json_stream.h"
#include "checkpoint/checkpoint.h"
#include "cli/commands.h"
#include "io/parallel.h"
#include "jobs/inspect.h"

namespace ckpt::cli {

namespace {

struct InspectCliOptions {
  std::vector<std::string> paths;
  bool json = false;
  size_t top = 20;
  std::vector<std::string> trust;
};

int RunInspect(const InspectCliOptions& o) {
  std::vector<std::unique_ptr<Checkpoint>> checkpoints = FindCheckpoints(o.paths);
  if (checkpoints.empty()) {
    PrintError("no checkpoint files found in the given paths");
    return 1;
  }
  jobs::InspectOptions io;
  io.top = o.top;
  io.trust = torch::Trust{o.trust};
  io.threads = DefaultThreads();
  bool first = true;
  jobs::InspectOutput out;
  out.text = [&](const std::string& text) {
    if (!first) Out() << "\n";
    Out() << text;
    first = false;
  };
  out.error = [](const std::string& what) { PrintError(what); };
  if (!o.json) return jobs::InspectText(checkpoints, io, out) ? 0 : 1;
  std::ostream& os = Out();
  JsonStream json([&os](std::string_view text) { os.write(text.data(), text.size()); });
  bool ok = jobs::InspectJson(checkpoints, io, json, out);
  json.Flush();
  Out() << "\n";
  return ok ? 0 : 1;
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
