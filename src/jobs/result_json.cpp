#include "jobs/result_json.h"

#include "base/error.h"

namespace ckpt {

using nlohmann::json;

namespace torch {
void from_json(const json& j, Problem& p) {
  j.at("where").get_to(p.where);
  j.at("what").get_to(p.what);
  j.at("unsafe").get_to(p.unsafe);
}
}  // namespace torch

void from_json(const json& j, ShrinkResult& r) {
  j.at("path").get_to(r.path);
  j.at("output").get_to(r.output);
  j.at("before").get_to(r.before);
  j.at("after").get_to(r.after);
  j.at("rewritten").get_to(r.rewritten);
  j.at("note").get_to(r.note);
}

void from_json(const json& j, DroppedEntry& d) {
  j.at("path").get_to(d.path);
  j.at("bytes").get_to(d.bytes);
}

void from_json(const json& j, StripResult& r) {
  j.at("path").get_to(r.path);
  j.at("output").get_to(r.output);
  j.at("before").get_to(r.before);
  j.at("after").get_to(r.after);
  j.at("dropped").get_to(r.dropped);
  j.at("rewritten").get_to(r.rewritten);
  j.at("note").get_to(r.note);
}

void from_json(const json& j, ConvertResult& r) {
  j.at("path").get_to(r.path);
  j.at("output").get_to(r.output);
  j.at("before").get_to(r.before);
  j.at("after").get_to(r.after);
  j.at("storage_bytes").get_to(r.storage_bytes);
  j.at("converted_tensors").get_to(r.converted);
  j.at("kept_float32_tensors").get_to(r.kept_float32);
  j.at("kept_training_state_tensors").get_to(r.kept_training);
  j.at("kept").get_to(r.kept);
  j.at("lost_precision").get_to(r.lost_precision);
  j.at("warnings").get_to(r.warnings);
}

void from_json(const json& j, CompressResult& r) {
  j.at("input").get_to(r.input);
  j.at("output").get_to(r.output);
  j.at("before").get_to(r.before);
  j.at("after").get_to(r.after);
  j.at("files").get_to(r.files);
  j.at("chunks").get_to(r.chunks);
  j.at("tensors").get_to(r.tensors);
  j.at("plain_zstd_chunks").get_to(r.whole_chunks);
  const json& t = j.at("by_transform");
  if (t.size() != std::size(r.by_transform))
    Fail("by_transform: {} entries, {} expected", t.size(), std::size(r.by_transform));
  for (size_t i = 0; i < t.size(); ++i) {
    t[i].at(0).get_to(r.by_transform[i].original);
    t[i].at(1).get_to(r.by_transform[i].stored);
  }
  j.at("warnings").get_to(r.warnings);
  j.at("removed").get_to(r.removed);
}

void from_json(const json& j, DecompressResult& r) {
  j.at("input").get_to(r.input);
  j.at("output").get_to(r.output);
  j.at("archive_bytes").get_to(r.archive_bytes);
  j.at("restored_bytes").get_to(r.restored_bytes);
  j.at("files").get_to(r.files);
  j.at("removed").get_to(r.removed);
}

void from_json(const json& j, VerifyOutcome& r) {
  j.at("problems").get_to(r.problems);
  j.at("ok").get_to(r.ok);
  j.at("notes").get_to(r.notes);
}

std::string ToCbor(const json& j) {
  std::vector<uint8_t> bytes = json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}

json FromCbor(const std::string& bytes) {
  return json::from_cbor(bytes);
}

}  // namespace ckpt
