// The names of manifest files (checkpoint/manifest.h), apart from the manifests themselves:
// discovery and the folder walkers skip them without depending on the manifest code.
#pragma once

#include <string>

namespace ckpt {

inline constexpr const char* kManifestName = "ckptool-manifest.json";
inline constexpr const char* kManifestSuffix = ".ckptool-manifest.json";

// Is this file name a manifest (the folder's, or a file's sidecar)?
inline bool IsManifestName(const std::string& name) {
  return name == kManifestName || name.ends_with(kManifestSuffix);
}

}  // namespace ckpt
