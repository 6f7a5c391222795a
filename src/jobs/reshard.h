// The reshard job, as `ckptool reshard` runs it: a DeepSpeed ZeRO checkpoint as DeepSpeed's
// universal checkpoint, or as native rank files for another number of ranks
// (engines/reshard.h). In an MPI job every rank writes its share of the parameters and rank 0
// checks, prepares and commits.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "engines/reshard.h"

namespace ckpt::jobs {

enum class ReshardTo { kUniversal, kZero };

struct ReshardJobOptions {
  ReshardOptions engine;  // output, tag, threads, force, world size (its team is set here)
  std::string checkpoint;
  ReshardTo to = ReshardTo::kUniversal;
  bool spread = true;  // every rank of an MPI job writes its share
};

struct ReshardReport {
  bool reports = true;  // false on ranks other than 0
  ReshardTo to = ReshardTo::kUniversal;
  ReshardResult result;
};

// --json's report: source, output, the stage and world sizes, parameters, optimizer state
// keys, files and bytes written.
nlohmann::ordered_json ToJson(const ReshardReport& r);

// Throws ckpt::UsageError for a world size missing (to ZeRO) or given (to universal).
ReshardReport Reshard(const ReshardJobOptions& o);

}  // namespace ckpt::jobs
