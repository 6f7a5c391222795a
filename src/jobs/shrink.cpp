#include "jobs/shrink.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "checkpoint/discovery.h"
#include "checkpoint/integrity.h"
#include "cluster/world.h"
#include "jobs/batch.h"
#include "jobs/result_json.h"

namespace ckpt::jobs {

namespace fs = std::filesystem;

namespace {

bool MatchesPatterns(const std::string& path, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return true;
  return MatchesAnyGlob(patterns, fs::path(path).filename().string());
}

// The files to shrink, and for each where it goes below --output-dir: a file named by its name,
// a file found in a folder by its path from the folder's parent (from the folder itself for
// checkpoint_dir), so that two runs' files of one name stay apart.
std::vector<std::string> CollectFiles(const ShrinkJobOptions& o, std::vector<std::string>* dcp,
                                      std::vector<std::string>* relative) {
  std::vector<std::string> files;
  auto add = [&](const std::string& f, const fs::path& base) {
    if (o.skip && o.skip(f)) return;
    files.push_back(f);
    relative->push_back(base.empty() ? fs::path(f).filename().string()
                                     : fs::path(f).lexically_relative(base).string());
  };
  if (!o.checkpoint_dir.empty()) {
    if (!fs::is_directory(o.checkpoint_dir)) Fail("{}: not a folder", o.checkpoint_dir);
    for (const std::string& f : ExpandInputs({o.checkpoint_dir}, nullptr, dcp)) {
      if (!MatchesPatterns(f, o.patterns) || (o.skip && o.skip(f))) continue;
      if (Shrinkable(f)) add(f, o.checkpoint_dir);
    }
  }
  // Files named are always taken; the patterns filter what folders hold.
  for (const std::string& p : o.files) {
    if (!fs::is_directory(p)) {
      add(p, {});
      continue;
    }
    fs::path folder = fs::path(p).lexically_normal();
    if (folder.filename().empty()) folder = folder.parent_path();
    for (const std::string& f : ExpandInputs({p}, nullptr, dcp)) {
      // A bare folder name ("run") has no parent: its files are kept relative to ".".
      fs::path base = folder.parent_path().empty() ? fs::path(".") : folder.parent_path();
      if (MatchesPatterns(f, o.patterns)) add(f, base);
    }
  }
  if (o.skip) std::erase_if(*dcp, o.skip);
  return files;
}

}  // namespace

size_t ShrinkReport::failed() const {
  return FailedOf(files);
}

nlohmann::ordered_json ToJson(const ShrinkReport& r) {
  nlohmann::ordered_json doc = OutcomesJson(r.files, "path");
  doc["before"] = r.before;
  doc["after"] = r.after;
  doc["saved"] = r.saved();
  doc["dry_run"] = r.dry_run;
  return doc;
}

ShrinkReport Shrink(const ShrinkJobOptions& o) {
  if (o.checkpoint_dir.empty() && o.files.empty())
    throw UsageError("give checkpoint files or --checkpoint_dir DIR");
  if (!o.output.empty() && !o.output_dir.empty())
    throw UsageError("-o names one output file, --output-dir a folder for many: give one of them");
  ShrinkReport report;
  report.dry_run = o.engine.dry_run;
  std::vector<std::string> relative;
  std::vector<std::string> files = CollectFiles(o, &report.dcp_folders, &relative);
  if (!o.output.empty() && files.size() != 1) {
    throw UsageError(
        fmt::format("-o names one output, and there are {} to shrink: use --output-dir",
                    Count(files.size(), "file")));
  }
  // Where each result goes: in place, or a new file that must not exist (--force) and that
  // no other input goes to.
  std::vector<std::string> outputs(files.size());
  std::map<std::string, size_t> taken;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!o.output.empty()) outputs[i] = o.output;
    if (!o.output_dir.empty()) outputs[i] = (fs::path(o.output_dir) / relative[i]).string();
    if (outputs[i].empty()) continue;
    std::error_code ec;
    std::string key = fs::weakly_canonical(outputs[i], ec).string();
    if (key == fs::weakly_canonical(files[i], ec).string()) {
      outputs[i].clear();  // the output is the input: in place
      continue;
    }
    if (auto [at, fresh] = taken.emplace(key, i); !fresh) {
      throw UsageError(fmt::format("{} and {} would both be written to {}", files[at->second],
                                   files[i], outputs[i]));
    }
    if (!o.force && !o.engine.dry_run && fs::exists(outputs[i]))
      Fail("{}: exists; --force replaces it", outputs[i]);
  }
  // torch.distributed.checkpoint saves every chunk compact (a view is cloned first): there is
  // nothing to cut. A damaged one is said to be damaged, not to be fine.
  if (o.check_dcp_folders && (!o.spread || cluster::IsRoot())) {
    for (const std::string& d : report.dcp_folders) RefuseDamaged(d, o.threads, "nothing shrunk");
  }
  if (files.empty()) return report;
  Batch batch(files, o.threads, "shrink", o.progress, SIZE_MAX, o.spread);
  ShrinkOptions so = o.engine;
  so.threads = batch.threads_per_file();
  so.bytes_done = batch.bytes_done();
  std::vector<ShrinkResult> results(files.size());
  std::vector<std::string> errors = batch.Run<ShrinkResult>(results, [&](size_t i) {
    ShrinkOptions mine = so;
    mine.output = outputs[i];
    return ShrinkFile(files[i], mine);
  });
  if (!batch.reports()) {
    report.reports = false;
    return report;
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (errors[i].empty()) {
      report.before += results[i].before;
      report.after += results[i].after;
    }
    report.files.push_back({files[i], errors[i], std::move(results[i])});
  }
  return report;
}

}  // namespace ckpt::jobs
