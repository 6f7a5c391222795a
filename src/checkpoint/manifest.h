// Manifests: what a checkpoint held when it was known good, so that any later change to its
// bytes (a flipped bit in a safetensors shard or a DCP chunk, which carry no checksum; a
// truncated or zeroed page; a missing or added file) is found by `verify`.
//
// A folder checkpoint's manifest is FOLDER/ckptool-manifest.json; a file's is
// FILE.ckptool-manifest.json beside it. It holds (docs/manifest.md):
//   - the SHA-256 of every file, as OpenSSF model signing's "files" serialization computes
//     them (its `resources`: relative POSIX path, algorithm, hex digest), so that a signature
//     made by that tool can wrap the same digests; symlinks are recorded with their targets;
//   - a digest per tensor over its logical bytes (dtype, shape, row-major little-endian
//     elements), the same for the same tensor whichever container holds it: a torch file, a
//     safetensors file, a ZeRO or DCP folder (consolidated), a .ckz archive.
//
// Commands that rewrite a file in place (shrink, convert, strip, and the policy's steps) check
// the file against the manifests that cover it first (a mismatch is damage: refused) and bring
// the manifest up to date after (io/atomic_output.h's replace hooks): it is never left stale.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/manifest_name.h"
#include "torch/model.h"

namespace ckpt {

// Where the manifest of the checkpoint at `path` is (whether or not it exists).
std::string ManifestPathOf(const std::string& path);

struct ManifestOptions {
  unsigned threads = 1;
  bool force = false;   // replace an existing manifest
  bool tensors = true;  // per-tensor digests (--no-tensors: files only)
};

struct ManifestResult {
  std::string checkpoint;
  std::string manifest;
  uint64_t files = 0;
  uint64_t bytes = 0;
  uint64_t tensors = 0;
  bool replaced = false;
  std::vector<std::string> notes;  // tensors no digest could be made of, and why
};

// Checks the checkpoint (FindDamage: structure and every checksum its formats carry; a damaged
// one is refused), then hashes every file (`threads` files at a time) and digests every tensor,
// and writes the manifest atomically.
ManifestResult WriteManifest(const std::string& path, const ManifestOptions& o);

// What differs between the checkpoint at `path` and its manifest: a file whose SHA-256
// differs, a file missing, a file the manifest does not name, a symlink pointing elsewhere.
// Empty when there is no manifest. `bytes` gets the bytes hashed. `digests` false: presence
// and sizes only (a cut, grown, missing or added file), without reading the files.
std::vector<torch::Problem> CheckManifest(const std::string& path, unsigned threads,
                                          uint64_t* bytes = nullptr, bool digests = true);

// A folder a command built elsewhere and renamed into place (reshard's output): its files go
// into the folder manifests above it, as AtomicOutput's hooks record a file written in place.
void RecordFolderWritten(const std::string& folder);

// Does a manifest exist for `path`?
bool HasManifest(const std::string& path);

// The checkpoints at or below `path` that have a manifest (the path itself, each folder with a
// ckptool-manifest.json, each file with one beside it), sorted; what verify checks.
std::vector<std::string> ManifestedAt(const std::string& path);

// The hooks that keep manifests true (installed once by every command-line entry point):
// before a file is replaced in place, it must match every manifest that names it; after, those
// manifests get its new digests (and its tensors', when they hold them).
void InstallManifestHooks();

// The digest of one tensor (for tests and tools): hex SHA-256 as described above.
struct LogicalTensor;
std::string TensorDigest(const LogicalTensor& t);

}  // namespace ckpt
