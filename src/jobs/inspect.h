// The inspect job: what every checkpoint in the paths given holds and costs, each described by
// its own kind (checkpoint/checkpoint.h), as text (one report after another) or as one JSON
// document ({"files": [...], "archives": [...], "zero": [...], "dcp": [...]}: "files" always,
// the others when something is listed under them), written as each checkpoint is described
// and then freed: every row of every file, yet memory bounded by one checkpoint.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/json_stream.h"
#include "checkpoint/checkpoint.h"
#include "torch/global_policy.h"

namespace ckpt::jobs {

struct InspectOptions {
  size_t top = 20;  // rows in the text tables
  torch::Trust trust;
  unsigned threads = 1;
};

// Where the reports go: `text` gets each text report; `error` each checkpoint (or checkpoint
// inside an archive) that could not be described, the rest described all the same.
struct InspectOutput {
  std::function<void(const std::string&)> text;
  std::function<void(const std::string&)> error;
};

// Returns false when something could not be described. An input changed while it was read
// (InputChanged) ends the job.
bool InspectText(const std::vector<std::unique_ptr<Checkpoint>>& checkpoints,
                 const InspectOptions& o, const InspectOutput& out);
bool InspectJson(const std::vector<std::unique_ptr<Checkpoint>>& checkpoints,
                 const InspectOptions& o, JsonStream& json, const InspectOutput& out);

}  // namespace ckpt::jobs
