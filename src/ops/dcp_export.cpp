#include "ops/dcp_export.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"
#include "base/human.h"
#include "base/names.h"
#include "dcp/dcp_checkpoint.h"
#include "ops/logical_export.h"
#include "ops/strip.h"

namespace ckpt {

ExportResult ExportDcp(const std::string& folder, const std::string& to, const ExportOptions& o) {
  if (!o.tag.empty() || o.exclude_frozen)
    Fail("--tag and --exclude-frozen apply to DeepSpeed ZeRO checkpoints");
  dcp::Checkpoint c = dcp::OpenDcp(folder);
  if (!c.problems.empty()) {
    Fail("{}: {}: {} ({} problem(s) in all; run ckptool verify)", folder, c.problems[0].where,
         c.problems[0].what, c.problems.size());
  }
  for (const torch::UnsafeFinding& u : c.meta.scan.findings)
    Fail("{}: {}: the pickle {}; refusing to read it further", folder, c.metadata_files[0], u.what);
  LogicalModel all = dcp::DcpLogicalModel(c);
  // The metadata's pickle graph is done with (strip alone rewrites it): free it before the
  // writer builds its own (at 10^5 tensors it is the largest part of the peak).
  c.meta.graph = pickle::Graph();
  auto below = [](const std::string& name, const std::string& prefix) {
    return IsBelowKeyPath(name, prefix);
  };
  std::string select = o.select;
  if (select.empty() && !o.all) {
    for (const char* candidate : {"state_dict", "module", "model_state_dict", "model"}) {
      if (std::any_of(all.tensors.begin(), all.tensors.end(),
                      [&](const LogicalTensor& t) { return below(t.name, candidate); })) {
        select = candidate;
        break;
      }
    }
  } else if (std::none_of(all.tensors.begin(), all.tensors.end(),
                          [&](const LogicalTensor& t) { return below(t.name, select); })) {
    Fail("--select {}: no tensors under that prefix", select);
  }
  LogicalModel m;
  m.inputs = all.inputs;
  uint64_t left_out = 0;
  const std::vector<std::string>& drop = DefaultDropKeys();
  const std::vector<std::string>& optim = OptimizerStateKeys();
  auto training_state = [&](const std::string& name) {
    std::string top = name.substr(0, name.find('.'));
    return std::find(drop.begin(), drop.end(), top) != drop.end() ||
           std::find(optim.begin(), optim.end(), top) != optim.end();
  };
  uint64_t outside = 0;  // neither selected nor training state
  for (LogicalTensor& t : all.tensors) {
    if (!select.empty()) {
      if (!below(t.name, select)) {
        outside += !training_state(t.name);
        continue;
      }
      t.name = t.name.substr(select.size() + 1);
    } else if (!o.all && training_state(t.name)) {
      ++left_out;
      continue;
    }
    m.tensors.push_back(std::move(t));
  }
  if (m.tensors.empty()) Fail("{}: no tensors to export", folder);
  m.description = fmt::format("{}{}", all.description,
                              select.empty() ? "" : fmt::format(", fqns under '{}'", select));
  if (outside && o.select.empty()) {
    m.warnings.push_back(fmt::format(
        "{} tensors outside '{}' (and not training state) left out; --select PREFIX picks "
        "another prefix",
        outside, select));
  }
  if (left_out) {
    m.warnings.push_back(
        fmt::format("{} left out (--all keeps them; --select PREFIX exports what is under PREFIX)",
                    Count(left_out, "training-state tensor")));
  }
  for (const dcp::Object& ob : c.objects) {
    for (const torch::UnsafeFinding& u : c.items[static_cast<size_t>(ob.item)].scan.findings)
      m.warnings.push_back(fmt::format(
          "object '{}': the pickle {} (never run; left behind by export)", ob.fqn, u.what));
  }
  return ExportLogical(m, to, o);
}

}  // namespace ckpt
