// What became of one input of a job (a file, a folder, a path), and a job's outcomes as the
// "files" list of its JSON report.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckpt::jobs {

template <typename R>
struct Outcome {
  std::string input;  // as the caller named it (an archive's member as "ARCHIVE: path")
  std::string error;  // why it failed ("" when done)
  R result;           // when done
};

template <typename R>
size_t FailedOf(const std::vector<Outcome<R>>& outcomes) {
  return static_cast<size_t>(std::count_if(outcomes.begin(), outcomes.end(),
                                           [](const Outcome<R>& o) { return !o.error.empty(); }));
}

// {"files": [each result as JSON (jobs/result_json.h), or {key: input, "error": error}]}.
template <typename R>
nlohmann::ordered_json OutcomesJson(const std::vector<Outcome<R>>& outcomes, const char* key) {
  nlohmann::ordered_json doc = {{"files", nlohmann::ordered_json::array()}};
  for (const Outcome<R>& o : outcomes) {
    if (o.error.empty()) {
      doc["files"].push_back(nlohmann::ordered_json(o.result));
    } else {
      doc["files"].push_back({{key, o.input}, {"error", o.error}});
    }
  }
  return doc;
}

}  // namespace ckpt::jobs
