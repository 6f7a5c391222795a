#include "jobs/output_place.h"

#include "base/error.h"
#include "cluster/world.h"

namespace ckpt::jobs {

std::optional<SharedPlace> MakeSharedPlace(const std::string& to, bool force,
                                           OutputPlace::Kind kind, bool every_rank) {
  SharedPlace s;
  if (!every_rank || !cluster::Distributed()) {
    if (cluster::IsRoot()) {
      s.place.emplace(to, force, kind);
      s.write_to = s.place->write_to();
    }
    return s;
  }
  std::string error;
  if (cluster::IsRoot()) {
    try {
      s.place.emplace(to, force, kind);
      s.write_to = s.place->write_to();
    } catch (const Error& e) {
      error = e.what();
    }
  }
  std::string decided = cluster::BroadcastFromRoot(error.empty() ? "+" + s.write_to : "-" + error);
  if (decided[0] == '-') {
    if (cluster::IsRoot()) throw Error(decided.substr(1));
    return std::nullopt;
  }
  s.write_to = decided.substr(1);
  return s;
}

}  // namespace ckpt::jobs
