// The results of the per-file operations as JSON values, so that the ranks of an MPI job can
// send them to rank 0 (cluster/steps.h), which prints the report a single process would.
// Every field round-trips exactly, including text that is not UTF-8 (send them as CBOR:
// nlohmann's JSON text writer refuses such strings, its CBOR writer keeps their bytes).
#pragma once

#include <nlohmann/json.hpp>

#include "ops/compress.h"
#include "ops/convert.h"
#include "ops/shrink.h"
#include "ops/strip.h"
#include "ops/verify.h"
#include "torch/model.h"

namespace ckpt {

namespace torch {
void to_json(nlohmann::json& j, const Problem& p);
void from_json(const nlohmann::json& j, Problem& p);
}  // namespace torch

void to_json(nlohmann::json& j, const ShrinkResult& r);
void from_json(const nlohmann::json& j, ShrinkResult& r);
void to_json(nlohmann::json& j, const DroppedEntry& d);
void from_json(const nlohmann::json& j, DroppedEntry& d);
void to_json(nlohmann::json& j, const StripResult& r);
void from_json(const nlohmann::json& j, StripResult& r);
void to_json(nlohmann::json& j, const ConvertResult& r);
void from_json(const nlohmann::json& j, ConvertResult& r);
void to_json(nlohmann::json& j, const CompressResult& r);
void from_json(const nlohmann::json& j, CompressResult& r);
void to_json(nlohmann::json& j, const DecompressResult& r);
void from_json(const nlohmann::json& j, DecompressResult& r);
void to_json(nlohmann::json& j, const VerifyOutcome& r);
void from_json(const nlohmann::json& j, VerifyOutcome& r);

// A value as CBOR bytes, and back.
std::string ToCbor(const nlohmann::json& j);
nlohmann::json FromCbor(const std::string& bytes);

}  // namespace ckpt
