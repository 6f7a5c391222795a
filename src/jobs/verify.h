// The verify job, as `ckptool verify` and the policy's [verify] step both run it: what to
// verify in the paths given (every checkpoint discovery finds, of any kind), each checkpoint
// verified on its own (so that the CLI can spread them over MPI ranks and print each as it is
// done), then the checks of whole folders beyond their files (indexes, links, manifests).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "checkpoint/discovery.h"
#include "checkpoint/verify.h"
#include "torch/global_policy.h"

namespace ckpt::jobs {

struct VerifyOptions {
  unsigned threads = 1;
  bool structure = false;  // sizes, headers, directories; no data byte read
  torch::Trust trust;
};

// What verifying one checkpoint found. `failed` holds an error that stopped it: a ckpt::Error
// is a problem of that checkpoint; anything else (`internal`) ends a run, as it would any
// command.
struct CheckpointVerdict {
  VerifyOutcome outcome;
  std::string failed;
  bool internal = false;

  bool ok() const { return failed.empty() && outcome.problems.empty(); }
};
void to_json(nlohmann::json& j, const CheckpointVerdict& v);
void from_json(const nlohmann::json& j, CheckpointVerdict& v);

// The checkpoints to verify in `paths`, in the order a report lists them (archives, files, ZeRO
// folders, DCP folders); those `skip` names are left out (the policy's own outputs).
std::vector<Located> VerifyTargets(const std::vector<std::string>& paths,
                                   const std::function<bool(const std::string&)>& skip = {});

CheckpointVerdict VerifyCheckpoint(const Located& item, const VerifyOptions& options);

// A check of a whole folder beyond its checkpoints' files: what a folder given promises
// (indexes against their shards, links against their targets), or a checkpoint's manifest
// (every file's bytes, or names and sizes with `structure`).
struct FolderVerdict {
  std::string path;       // the folder given, or the checkpoint with a manifest
  std::string json_path;  // what the JSON report names: the folder, or the manifest file
  std::vector<torch::Problem> problems;
  bool manifest = false;
  uint64_t hashed = 0;  // a manifest's bytes SHA-256-checked
};
std::vector<FolderVerdict> VerifyFolders(const std::vector<std::string>& paths,
                                         const VerifyOptions& options);

}  // namespace ckpt::jobs
