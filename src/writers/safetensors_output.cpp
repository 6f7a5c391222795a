#include "writers/safetensors_output.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "base/error.h"
#include "base/interrupt.h"
#include "base/name_index.h"
#include "base/perf.h"
#include "io/atomic_output.h"
#include "io/checked_ranges.h"
#include "io/crc32.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "safetensors/safetensors_file.h"
#include "safetensors/safetensors_writer.h"

namespace ckpt {

namespace fs = std::filesystem;

namespace {

// Writes and verifies one file; the caller commits it.
AtomicOutput WriteVerified(const std::string& path, std::vector<TensorSource>& tensors,
                           const std::map<std::string, std::string>& metadata,
                           const SafetensorsModelOptions& o) {
  // Test hook (tests/integration/test_mpi.py): the file of this name fails to be written, on
  // whichever rank writes it.
  if (const char* fail = std::getenv("CKPTOOL_TEST_FAIL_WRITE");
      fail && fs::path(path).filename() == fail)
    Fail("{}: cannot be written (CKPTOOL_TEST_FAIL_WRITE)", path);
  // Widest dtype first, then by name: safetensors' own order, which keeps every tensor aligned.
  std::stable_sort(tensors.begin(), tensors.end(),
                   [](const TensorSource& a, const TensorSource& b) {
                     uint32_t x = torch::ElementSize(a.dtype), y = torch::ElementSize(b.dtype);
                     return x != y ? x > y : a.name < b.name;
                   });
  std::vector<safetensors::OutTensor> outs;
  outs.reserve(tensors.size());
  std::deque<std::vector<int64_t>> header_shapes;  // where the header's shape differs (F4)
  for (const TensorSource& t : tensors) {
    std::span<const int64_t> shape = t.shape;
    if (t.dtype == torch::DType::kFloat4E2M1FNX2) {
      shape = header_shapes.emplace_back(torch::SafetensorsShape(t.dtype, t.shape));
    }
    outs.push_back({t.name, torch::Info(t.dtype).safetensors, shape, t.size});
  }
  safetensors::Layout layout = safetensors::LayOut(outs, metadata);
  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(path, layout.total_size);
  for (const MappedFile* in : o.inputs) out.RequireUnchanged(*in);
  out.Write(0, AsBytes(layout.header));
  std::vector<uint64_t> sizes;
  sizes.reserve(tensors.size());
  for (const TensorSource& t : tensors) sizes.push_back(t.whole ? WholeRange(t.size) : t.size);
  // Inputs without a descriptor are decoded as they are read (an archive's members): their
  // tensors are read in source order, so that a chunk decoded for one serves the next. (Either
  // way is correct: this is about speed.)
  bool decoded = false;
  for (const MappedFile* in : o.inputs) decoded = decoded || in->fd() < 0;
  std::vector<uint64_t> read_order;
  if (decoded) {
    read_order.reserve(tensors.size());
    for (const TensorSource& t : tensors) read_order.push_back(t.read_order);
  }
  // Pieces are read back as they land (io/checked_ranges.h); runs of small tensors are not.
  CheckedRanges checked(tensors.size());
  auto piece = [&](size_t i, uint64_t off, uint64_t len) {
    const TensorSource& t = tensors[i];
    return checked.Write(out, i, [&] {
      return t.whole ? t.write(out, layout.offsets[i], 0, t.size)
                     : t.write(out, layout.offsets[i] + off, off, len);
    });
  };
  std::vector<uint32_t> crcs;
  if (decoded) {
    crcs = ParallelCrc(sizes, o.threads, kCrcPiece, piece, &read_order);
  } else {
    // Runs of small tensors are written by one job each, staged in memory: one pwrite per run.
    std::vector<uint64_t> span(tensors.size());
    std::vector<bool> small(tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      span[i] = tensors[i].size;
      small[i] = tensors[i].size < kSmallRange;
    }
    crcs = ParallelCrcInRuns(
        sizes, span, small, o.threads, piece, [&](size_t first, size_t end, uint32_t* run_crcs) {
          uint64_t begin = layout.offsets[first];
          AtomicOutput::Staged staged(out, begin,
                                      layout.offsets[end - 1] + tensors[end - 1].size - begin);
          std::vector<FileRange> reads;
          for (size_t i = first; i < end && reads.size() == i - first; ++i) {
            if (tensors[i].input != nullptr && tensors[i].input == tensors[first].input)
              reads.push_back(tensors[i].input_range);
          }
          std::optional<MappedFile::Prefetched> prefetched;
          if (reads.size() == end - first) {
            if (auto cover = CoveringRange(reads))
              prefetched.emplace(*tensors[first].input, cover->offset, cover->size);
          }
          for (size_t i = first; i < end; ++i)
            run_crcs[i] = tensors[i].write(out, layout.offsets[i], 0, tensors[i].size);
          staged.Flush();
        });
  }
  out.SetDefaultMode();
  out.Sync();
  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was written", path), [&] {
    PerfTimer verify("verify");
    // Each entry is checked against the plan as the header is parsed; what stays per tensor
    // is its span (24 bytes), not a table of names, dtypes and shapes.
    NameIndex index;  // the planned tensors by name
    index.Reserve(tensors.size());
    auto name_of = [&tensors](uint32_t i) -> std::string_view { return tensors[i].name; };
    for (size_t i = 0; i < tensors.size(); ++i)
      index.Insert(tensors[i].name, static_cast<uint32_t>(i), name_of);
    std::vector<safetensors::Span> spans;
    spans.reserve(tensors.size());
    std::vector<bool> seen(tensors.size(), false);
    safetensors::Header back =
        safetensors::ParseEach(written.bytes(), [&](safetensors::TensorEntry&& e) {
          uint32_t i = index.Find(e.name, name_of);
          if (i == NameIndex::kNone || seen[i] ||
              e.dtype != torch::Info(tensors[i].dtype).safetensors ||
              e.shape != torch::SafetensorsShape(tensors[i].dtype, tensors[i].shape) ||
              e.end - e.begin != tensors[i].size) {
            Fail("tensor '{}' is not what was planned", e.name);
          }
          seen[i] = true;
          spans.push_back({e.begin, e.end, i});
        });
    // The header was read through the mapping (13 MiB for 10^5 tensors): drop its pages.
    written.Release(0, back.data_offset);
    if (spans.size() != tensors.size()) Fail("tensor count differs");
    safetensors::CheckTiling(spans, written.size() - back.data_offset,
                             [&](size_t i) -> std::string_view { return tensors[i].name; });
    // A tensor read back as it was written needs only to be where it was written (the
    // tiling check above keeps every other write out of its span); the others are read again.
    CrcChecks reread;
    for (const safetensors::Span& t : spans) {
      if (checked.checked(t.id)) {
        if (back.data_offset + t.begin != layout.offsets[t.id])
          Fail("tensor '{}' is not where it was written", tensors[t.id].name);
        continue;
      }
      reread.Add(back.data_offset + t.begin, t.end - t.begin, crcs[t.id], t.id);
    }
    reread.Run(written, o.threads, [&](size_t i) {
      Fail("tensor '{}' does not hold the bytes written", tensors[i].name);
    });
  });
  return out;
}

// An error as main() would print it.
std::string Describe(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const fs::filesystem_error& x) {
    return fmt::format("{}: {}", x.path1().string(), x.code().message());
  } catch (const Error& x) {
    return x.what();
  } catch (const std::exception& x) {
    return std::string("internal error: ") + x.what();
  }
}

}  // namespace

SafetensorsModel WriteSafetensorsModel(const std::string& to, std::vector<TensorSource> tensors,
                                       const std::map<std::string, std::string>& aliases,
                                       const SafetensorsModelOptions& o) {
  RequireDistinctNames(tensors, aliases);
  for (const TensorSource& t : tensors) {
    if (torch::Info(t.dtype).safetensors.empty())
      Fail("tensor '{}': safetensors has no {} dtype", t.name, torch::Name(t.dtype));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].read_order == TensorSource::kUnordered) tensors[i].read_order = i;
  }
  // Shards, in order, as Hugging Face splits them.
  std::vector<std::vector<TensorSource>> shards(1);
  uint64_t current = 0;
  if (!o.max_shard_size) {  // one file: no copy of the list
    shards[0] = std::move(tensors);
    tensors.clear();
  }
  for (TensorSource& t : tensors) {
    if (o.max_shard_size && !shards.back().empty() && current + t.size > o.max_shard_size) {
      shards.emplace_back();
      current = 0;
    }
    current += t.size;
    shards.back().push_back(std::move(t));
  }
  bool single_file = to.ends_with(".safetensors");
  fs::path dir = single_file ? fs::path(to).parent_path() : fs::path(to);
  std::string stem = single_file ? fs::path(to).stem().string() : "model";
  if (!dir.empty()) fs::create_directories(dir);
  SafetensorsModel r;
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  for (size_t si = 0; si < shards.size(); ++si) {
    shard_names.push_back(shards.size() == 1 ? stem + ".safetensors"
                                             : fmt::format("{}-{:05d}-of-{:05d}.safetensors", stem,
                                                           si + 1, shards.size()));
    for (const TensorSource& t : shards[si]) {
      if (shards.size() > 1) weight_map[t.name] = shard_names.back();  // for the index
      r.bytes += t.size;
    }
  }
  // Each alias is recorded in the shard that holds the tensor it names.
  std::vector<std::map<std::string, std::string>> metadata(shards.size());
  std::unordered_map<std::string_view, size_t> shard_of;  // kept names -> shard
  for (const auto& [alias, kept] : aliases) shard_of.emplace(kept, SIZE_MAX);
  for (size_t si = 0; si < shards.size() && !shard_of.empty(); ++si) {
    for (const TensorSource& t : shards[si]) {
      auto it = shard_of.find(t.name);
      if (it != shard_of.end()) it->second = si;
    }
  }
  for (const auto& [alias, kept] : aliases) {
    size_t si = shard_of.at(kept);
    if (si != SIZE_MAX) metadata[si][alias] = kept;
  }
  for (size_t si = 0; si < shards.size(); ++si) r.files.push_back((dir / shard_names[si]).string());
  if (!o.team) {
    for (size_t si = 0; si < shards.size(); ++si)
      WriteVerified(r.files[si], shards[si], metadata[si], o).Commit();
  } else {
    // Every process writes and verifies its shards, then puts into place those below the
    // first shard that failed anywhere: the files a single process leaves.
    std::vector<uint64_t> shard_bytes;
    for (const auto& shard : shards) {
      uint64_t b = 0;
      for (const TensorSource& t : shard) b += t.size;
      shard_bytes.push_back(b);
    }
    size_t failed = shards.size();
    std::string error;
    std::vector<std::pair<size_t, AtomicOutput>> done;
    for (size_t si : o.team->plan(shard_names, shard_bytes)) {
      try {
        done.emplace_back(si, WriteVerified(r.files[si], shards[si], metadata[si], o));
      } catch (const Interrupted&) {
        throw;  // in-process only, never under MPI: no rank waits for this one
      } catch (...) {
        error = Describe(std::current_exception());
        failed = si;
        break;
      }
    }
    ShardVerdict verdict = o.team->written(failed, error);
    std::string commit_error;
    for (auto& [si, out] : done) {
      if (si >= verdict.commit_below) break;  // the rest are removed with their AtomicOutput
      try {
        out.Commit();
      } catch (...) {
        commit_error = Describe(std::current_exception());
        break;
      }
    }
    // The shards not put into place go now, before rank 0 learns that every rank is done (it
    // may remove the folder they are in).
    done.clear();
    std::string confirmed = o.team->committed(commit_error);
    if (!verdict.error.empty()) throw Error(verdict.error);
    if (!error.empty()) throw Error(error);
    if (!commit_error.empty()) throw Error(commit_error);
    if (!confirmed.empty()) throw Error(confirmed);
    if (!o.team->writes_index) return r;
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", r.bytes}};
    index["weight_map"] = nlohmann::ordered_json(weight_map);
    std::string text =
        index.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::string path = (dir / (stem + ".safetensors.index.json")).string();
    AtomicOutput out = AtomicOutput::Create(path, text.size());
    out.Write(0, AsBytes(text));
    out.Commit();
    r.files.push_back(path);
  }
  return r;
}

}  // namespace ckpt
