// The results of the per-file operations as JSON: the one serialisation of each, which the
// commands print under --json (their public field names) and the ranks of an MPI job send to
// rank 0 (cluster/steps.h), which prints the report a single process would. Every field
// round-trips exactly, including text that is not UTF-8 (send them as CBOR: nlohmann's JSON
// text writer refuses such strings, its CBOR writer keeps their bytes). to_json works for
// nlohmann::json and nlohmann::ordered_json (the printed order is the order below).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>

#include "checkpoint/verify.h"
#include "engines/compress.h"
#include "engines/convert.h"
#include "engines/export.h"
#include "engines/shrink.h"
#include "engines/strip.h"
#include "torch/model.h"

namespace ckpt {

namespace torch {
template <typename J>
void to_json(J& j, const Problem& p) {
  j = J{{"where", p.where}, {"what", p.what}, {"unsafe", p.unsafe}};
}
void from_json(const nlohmann::json& j, Problem& p);
}  // namespace torch

template <typename J>
void to_json(J& j, const ExportResult& r) {
  j = J{{"source", r.source},   {"selected", r.selected}, {"files", r.files},
        {"tensors", r.tensors}, {"aliases", r.aliases},   {"bytes", r.bytes}};
  if (r.archive_plain_bytes + r.archive_backed_bytes)
    j["archive"] = J{{"plain_bytes", r.archive_plain_bytes},
                     {"tensor_bytes_in_place", r.archive_backed_bytes}};
}

template <typename J>
void to_json(J& j, const ShrinkResult& r) {
  j = J{{"path", r.path},
        {"output", r.output},
        {"before", r.before},
        {"after", r.after},
        {"saved", r.before - std::min(r.before, r.after)},
        {"rewritten", r.rewritten},
        {"note", r.note}};
}
void from_json(const nlohmann::json& j, ShrinkResult& r);

template <typename J>
void to_json(J& j, const DroppedEntry& d) {
  j = J{{"path", d.path}, {"bytes", d.bytes}};
}
void from_json(const nlohmann::json& j, DroppedEntry& d);

template <typename J>
void to_json(J& j, const StripResult& r) {
  J dropped = J::array();
  for (const DroppedEntry& d : r.dropped) dropped.push_back(J(d));
  j = J{{"path", r.path},     {"output", r.output},       {"before", r.before}, {"after", r.after},
        {"dropped", dropped}, {"rewritten", r.rewritten}, {"note", r.note}};
}
void from_json(const nlohmann::json& j, StripResult& r);

template <typename J>
void to_json(J& j, const ConvertResult& r) {
  j = J{{"path", r.path},
        {"output", r.output},
        {"before", r.before},
        {"after", r.after},
        {"converted_tensors", r.converted},
        {"kept_float32_tensors", r.kept_float32},
        {"kept_training_state_tensors", r.kept_training},
        {"kept", r.kept},
        {"lost_precision", r.lost_precision},
        {"warnings", r.warnings},
        {"storage_bytes", r.storage_bytes}};
}
void from_json(const nlohmann::json& j, ConvertResult& r);

template <typename J>
void to_json(J& j, const CompressResult& r) {
  J transforms = J::array();
  for (const CodingStats& s : r.by_transform)
    transforms.push_back(J::array({s.original, s.stored}));
  j = J{{"input", r.input},      {"output", r.output},
        {"before", r.before},    {"after", r.after},
        {"files", r.files},      {"chunks", r.chunks},
        {"tensors", r.tensors},  {"plain_zstd_chunks", r.whole_chunks},
        {"removed", r.removed},  {"by_transform", transforms},
        {"warnings", r.warnings}};
}
void from_json(const nlohmann::json& j, CompressResult& r);

template <typename J>
void to_json(J& j, const DecompressResult& r) {
  j = J{{"input", r.input},
        {"output", r.output},
        {"archive_bytes", r.archive_bytes},
        {"restored_bytes", r.restored_bytes},
        {"files", r.files},
        {"removed", r.removed}};
}
void from_json(const nlohmann::json& j, DecompressResult& r);

template <typename J>
void to_json(J& j, const VerifyOutcome& r) {
  J problems = J::array();
  for (const torch::Problem& p : r.problems) problems.push_back(J(p));
  j = J{{"problems", problems}, {"ok", r.ok}, {"notes", r.notes}};
}
void from_json(const nlohmann::json& j, VerifyOutcome& r);

// A value as CBOR bytes, and back.
std::string ToCbor(const nlohmann::json& j);
nlohmann::json FromCbor(const std::string& bytes);

}  // namespace ckpt
