// The export job, as `ckptool export` and the policy's [export] step both run it: the model a
// checkpoint holds, whatever its container, written as safetensors or one torch file
// (engines/export.h), put into place whole (a previous export's files replaced as a whole
// with `force`). In an MPI job the shards of a sharded safetensors output are written by
// every rank, rank 0 writing the index once all are in place; any other output by rank 0.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "engines/export.h"

namespace ckpt::jobs {

struct ExportJobOptions {
  ExportOptions engine;  // selection, dtype, shards, ZeRO options (its team is set here)
  std::vector<std::string> sources;
  std::string to;
  bool force = false;
  bool spread = true;  // over the ranks of an MPI job (false: a policy step, on one rank)
  // A model folder whose model files are safetensors already is not exported again (the
  // policy's [export] step: it makes safetensors of what is not).
  bool skip_safetensors_model = false;
};

struct ExportReport {
  bool reports = true;               // false on ranks other than 0
  bool already_safetensors = false;  // skipped (skip_safetensors_model): nothing written
  ExportResult result;
};

// --json's report: the engine's result.
nlohmann::ordered_json ToJson(const ExportReport& r);

// Throws ckpt::Error when the output exists (without `force`) or the export fails; nothing of
// the new output is left then.
ExportReport Export(const ExportJobOptions& o);

}  // namespace ckpt::jobs
