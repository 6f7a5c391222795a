// Rendering inspect reports: a human table (bloaty-style) and the --json document.
#pragma once

#include <string>

#include "base/json_stream.h"
#include "reports/inspect_report.h"

namespace ckpt {

std::string RenderText(const FileReport& r, size_t top_n);
// The report as one JSON object, written row by row.
void WriteJson(JsonStream& out, const FileReport& r);

}  // namespace ckpt
