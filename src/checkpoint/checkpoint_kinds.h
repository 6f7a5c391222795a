// The implementations of checkpoint/checkpoint.h, one per kind of container, for the table in
// checkpoint.cpp. Private to checkpoint/.
#pragma once

#include <memory>
#include <string>

namespace ckpt {
class Checkpoint;
}  // namespace ckpt

namespace ckpt::kinds {

std::unique_ptr<Checkpoint> OpenFile(const std::string& path);     // file_checkpoint.cpp
std::unique_ptr<Checkpoint> OpenArchive(const std::string& path);  // archive_checkpoint.cpp
std::unique_ptr<Checkpoint> OpenZero(const std::string& path);     // zero_folder.cpp
std::unique_ptr<Checkpoint> OpenDcp(const std::string& path);      // dcp_folder.cpp

}  // namespace ckpt::kinds
