// Rendering inspect reports: a human table (bloaty-style) and the --json document.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "ops/inspect_report.h"

namespace ckpt {

std::string RenderText(const FileReport& r, size_t top_n);
nlohmann::ordered_json RenderJson(const FileReport& r);

}  // namespace ckpt
