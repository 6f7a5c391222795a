// The output place (writers/output_set.h) of a job that may run in an MPI job: rank 0 makes it
// and, when every rank writes into it, tells them where.
#pragma once

#include <optional>
#include <string>

#include "writers/output_set.h"

namespace ckpt::jobs {

struct SharedPlace {
  std::optional<OutputPlace> place;  // rank 0's (none on the other ranks)
  std::string write_to;              // where every rank writes
};

// `every_rank`: all ranks write into the place (they learn its path from rank 0); otherwise
// only rank 0 does. Rank 0 throws when the place cannot be made (the output exists and no
// --force...); the other ranks then get std::nullopt and should exit 1 quietly.
std::optional<SharedPlace> MakeSharedPlace(const std::string& to, bool force,
                                           OutputPlace::Kind kind, bool every_rank);

}  // namespace ckpt::jobs
