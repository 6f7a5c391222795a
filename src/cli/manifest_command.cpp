// `ckptool manifest CKPT...`: checkpoint/manifest.h.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/utf8.h"
#include "checkpoint/manifest.h"
#include "cli/commands.h"
#include "io/parallel.h"

namespace ckpt::cli {

namespace {

struct ManifestCliOptions {
  std::vector<std::string> paths;
  unsigned threads = DefaultThreads();
  bool force = false;
  bool no_tensors = false;
  bool json = false;
  bool quiet = false;
};

int RunManifest(const ManifestCliOptions& o) {
  ManifestOptions mo;
  mo.threads = std::max(1u, o.threads);
  mo.force = o.force;
  mo.tensors = !o.no_tensors;
  nlohmann::ordered_json doc = {{"manifests", nlohmann::ordered_json::array()}};
  int rc = 0;
  for (const std::string& p : o.paths) {
    ManifestResult r;
    try {
      r = WriteManifest(p, mo);
    } catch (const Error& e) {
      PrintError(e.what());
      rc = 1;
      continue;
    }
    if (o.json) {
      doc["manifests"].push_back({{"checkpoint", r.checkpoint},
                                  {"manifest", r.manifest},
                                  {"files", r.files},
                                  {"bytes", r.bytes},
                                  {"tensors", r.tensors},
                                  {"replaced", r.replaced},
                                  {"notes", r.notes}});
      continue;
    }
    if (o.quiet) continue;
    Out() << Printable(fmt::format("{}: {} ({}, {}, {} tensor digests){}", r.checkpoint, r.manifest,
                                   Count(r.files, "file"), HumanBytes(r.bytes), r.tensors,
                                   r.replaced ? " (replaced)" : ""))
          << "\n";
    for (const std::string& n : r.notes) Out() << "  note: " << Printable(n) << "\n";
  }
  if (o.json) PrintJson(doc);
  return rc;
}

}  // namespace

Runner AddManifest(CLI::App& app) {
  auto o = std::make_shared<ManifestCliOptions>();
  app.add_option("paths", o->paths, "Checkpoints (files or folders)")->required();
  app.add_option("-j,--threads", o->threads, "Threads (files hashed side by side)")
      ->capture_default_str();
  app.add_flag("-f,--force", o->force, "Write the manifest again when one exists");
  app.add_flag("--no-tensors", o->no_tensors, "Files' SHA-256 only, no per-tensor digests");
  app.add_flag("--json", o->json, "Print a JSON report");
  app.add_flag("-q,--quiet", o->quiet, "Print only errors");
  app.footer(
      "Writes FOLDER/ckptool-manifest.json (a file's: FILE.ckptool-manifest.json): the SHA-256 "
      "of every file, as OpenSSF model signing computes them, and a digest per tensor over its "
      "logical bytes. The checkpoint must pass verify first. verify, latest, prune and apply "
      "then check it against the manifest; shrink, convert and strip keep it up to date. See "
      "docs/manifest.md.");
  return [o] { return RunManifest(*o); };
}

}  // namespace ckpt::cli
