// Fuzz target: the .ckz archive reader. Opens the bytes as an archive (trailer, index and
// every check of ParseIndex), renders inspect's report, and decodes every chunk (each at most
// 4 MiB) through the chunk coder, which must refuse or return the bytes whose CRC32 the index
// promised; verify's parallel pass must agree with the serial one.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "base/error.h"
#include "compress/archive.h"
#include "engines/compress.h"
#include "io/crc32.h"
#include "reports/archive_report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    ckpt::ckz::Archive a = ckpt::ckz::Archive::FromBytes(ckpt::Bytes(data, size), "fuzz.ckz");
    ckpt::RenderArchiveText(a, 5);
    std::string json;
    {
      ckpt::JsonStream out([&json](std::string_view t) { json.append(t); });
      ckpt::WriteArchiveJson(out, a);
    }
    if (!nlohmann::ordered_json::parse(json).is_object()) __builtin_trap();
    ckpt::ckz::ChunkCoder coder;
    std::vector<uint8_t> buf;
    size_t good = 0;
    for (size_t k = 0; k < a.index().chunks.size(); ++k) {
      const ckpt::ckz::Chunk& c = a.index().chunks[k];
      buf.assign(c.length, 0);
      try {
        a.DecodeChunk(coder, k, buf.data());
        // A chunk that decodes holds what its checksum says.
        if (ckpt::Crc32(0, ckpt::Bytes(buf.data(), buf.size())) != c.crc) std::abort();
        ++good;
      } catch (const ckpt::Error&) {
      }
    }
    ckpt::ArchiveVerifyResult v = ckpt::VerifyArchive(a, 1);
    if (v.chunks != a.index().chunks.size()) std::abort();
    size_t bad_chunks = 0;
    for (const auto& p : v.problems) bad_chunks += p.where.find(": chunk ") != std::string::npos;
    if (bad_chunks != a.index().chunks.size() - good) std::abort();
  } catch (const ckpt::Error&) {
  }
  return 0;
}
