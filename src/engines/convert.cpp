#include "engines/convert.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <span>
#include <vector>

#include "base/error.h"
#include "base/names.h"
#include "base/perf.h"
#include "checkpoint/training_state.h"
#include "file/checkpoint_file.h"
#include "io/atomic_output.h"
#include "io/checked_ranges.h"
#include "io/file_copy.h"
#include "io/parallel.h"
#include "io/parallel_crc.h"
#include "io/range_stream.h"
#include "kernels/conversion_loss.h"
#include "rewriters/rewritable.h"
#include "rewriters/shrink_plan.h"
#include "rewriters/torch_rewrite.h"
#include "safetensors/safetensors_writer.h"
#include "writers/piece_writer.h"

namespace ckpt {

namespace {

std::string JoinNames(const std::vector<std::string>& names, size_t max = 3) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += fmt::format(" and {} more", names.size() - max);
  return s;
}

// ---- torch ----

ConvertResult ConvertTorch(CheckpointFile& f, const std::string& output, const ConvertOptions& o,
                           ConvertResult r) {
  CheckRewritable(f, o.allow_unsafe_globals, o.trust, o.threads);
  const torch::Model& m = f.torch->model;
  ShrinkPlan plan = PlanShrink(*f.torch);
  RewritePlan& rp = plan.rewrite;
  // The tensors of each planned storage, grouped in one array (a vector per storage would
  // cost an allocation per storage: 10^5 of them in a plain state dict).
  std::vector<size_t> first(rp.storages.size() + 1, 0), grouped;
  for (size_t j = 0; j < m.tensors.size(); ++j) {
    if (m.tensors[j].storage >= 0) first[rp.tensor_storage[j] + 1]++;
  }
  for (size_t c = 0; c < rp.storages.size(); ++c) first[c + 1] += first[c];
  grouped.resize(first.back());
  {
    std::vector<size_t> next(first.begin(), first.end() - 1);
    for (size_t j = 0; j < m.tensors.size(); ++j) {
      if (m.tensors[j].storage >= 0) grouped[next[rp.tensor_storage[j]]++] = j;
    }
  }
  auto members = [&](size_t c) {
    return std::span<const size_t>(grouped.data() + first[c], first[c + 1] - first[c]);
  };
  std::vector<bool> bare(rp.storages.size(), false);
  for (int32_t b : rp.bare_storage) bare[b] = true;
  TrainingState training(f.path, &m.graph);
  // By default the model's weights (ModelKey) are converted; --only names others.
  const std::string model_key = ModelKey(m);
  auto in_model = [&](const torch::NameList& names) {
    for (std::string_view n : names) {
      if (UnderKey(n, model_key)) return true;
    }
    return false;
  };
  // First what the names and dtypes decide; then the values of each candidate, measured on
  // every thread in pieces.
  struct Candidate {
    size_t storage;
    std::vector<std::string> names;
    bool training;
  };
  std::vector<Candidate> candidates;
  for (size_t c = 0; c < rp.storages.size(); ++c) {
    PlannedStorage& s = rp.storages[c];
    const torch::Storage& src = m.storages[s.source];
    std::vector<std::string> yes, no;
    bool float32 = !members(c).empty(), in_training = false, master = false;
    for (size_t j : members(c)) {
      const torch::Tensor& t = m.tensors[j];
      if (t.dtype != torch::DType::kFloat32) float32 = false;
      bool training_state = training.Contains(t.names);
      in_training |= training_state;
      for (std::string_view n : t.names) master |= IsMasterWeightName(n);
      // Training state asked for by --include-optimizer, or by name with --only.
      bool wanted =
          o.only.empty() ? (training_state ? o.include_optimizer : in_model(t.names)) : true;
      (wanted && SelectedForConversion(t.names, t.shape.size(), o) ? yes : no)
          .emplace_back(t.names[0]);
    }
    bool typed_ok =
        src.dtype == torch::DType::kFloat32 ||
        (src.dtype == torch::DType::kUntyped && s.begin % 4 == 0 && (s.end - s.begin) % 4 == 0);
    if (!float32 || !typed_ok || bare[c] || src.compressed) {
      continue;
    }
    if (master) {
      r.kept_float32 += yes.size() + no.size();
      r.kept_training += yes.size() + no.size();
      r.kept.push_back(JoinNames(yes.empty() ? no : yes) +
                       ": DeepSpeed's fp32 master weights are never converted");
      continue;
    }
    if (in_training && yes.empty()) {
      r.kept_float32 += no.size();
      r.kept_training += no.size();
      continue;
    }
    if (yes.empty()) {
      r.kept_float32 += no.size();
      continue;
    }
    if (!no.empty()) {
      r.warnings.push_back(
          fmt::format("{} and {} share a storage; kept as float32 so they still alias",
                      JoinNames(yes), JoinNames(no)));
      r.kept_float32 += yes.size() + no.size();
      continue;
    }
    candidates.push_back({c, std::move(yes), in_training});
  }
  std::vector<kernels::ConversionLoss> loss(candidates.size());
  {
    constexpr uint64_t kPiece = 16u << 20;          // bytes measured per job
    std::vector<std::pair<size_t, uint64_t>> jobs;  // (candidate, offset in its span)
    for (size_t k = 0; k < candidates.size(); ++k) {
      const PlannedStorage& s = rp.storages[candidates[k].storage];
      for (uint64_t off = 0; off < s.end - s.begin; off += kPiece) jobs.emplace_back(k, off);
    }
    std::vector<kernels::ConversionLoss> parts(jobs.size());
    Bytes bytes = f.map.bytes();
    ParallelFor(jobs.size(), o.threads, [&](size_t i) {
      const PlannedStorage& s = rp.storages[candidates[jobs[i].first].storage];
      const torch::Storage& src = m.storages[s.source];
      uint64_t len = std::min<uint64_t>(kPiece, s.end - s.begin - jobs[i].second);
      Bytes span = Slice(bytes, src.data_offset + s.begin + jobs[i].second, len);
      parts[i] = kernels::MeasureLoss(o.to, span.data(), len / 4);
    });
    for (size_t i = 0; i < jobs.size(); ++i) loss[jobs[i].first].Add(parts[i]);
    f.map.Release(0, f.map.size());
  }
  bool any = false;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const Candidate& cand = candidates[k];
    std::string why = loss[k].Reason(o.to);
    if (!why.empty() && !o.lossy) {
      r.kept_float32 += cand.names.size();
      r.kept.push_back(JoinNames(cand.names) + ": " + why);
      continue;
    }
    if (!why.empty()) {
      r.lost_precision.push_back(JoinNames(cand.names) + ": " + why);
    } else if (cand.training && loss[k].to_zero + loss[k].to_subnormal) {
      r.lost_precision.push_back(fmt::format("{}: {} values became zero or subnormal",
                                             JoinNames(cand.names),
                                             loss[k].to_zero + loss[k].to_subnormal));
    }
    PlannedStorage& s = rp.storages[cand.storage];
    s.convert = true;
    s.to = o.to;
    r.converted += cand.names.size();
    any = true;
  }
  if (!any && !plan.changes) {
    if (!o.dry_run) CopyFileAtomically(f.map, output);
    for (const PlannedStorage& s : rp.storages) r.storage_bytes += s.size();
    r.after = r.before;
    return r;
  }
  TorchRewrite rewrite(f, std::move(plan.rewrite));
  if (o.dry_run) {
    r.after = rewrite.output_size();
    return r;
  }
  WriteProgress progress;
  progress.bytes_done = o.bytes_done;
  rewrite.Write(output, o.threads, progress);
  r.after = rewrite.output_size();
  for (size_t c = 0; c < rewrite.plan().storages.size(); ++c) {
    const PlannedStorage& s = rewrite.plan().storages[c];
    if (rewrite.written(c)) r.storage_bytes += s.size();
    if (rewrite.overflow()[c]) {
      std::vector<std::string> names;
      for (size_t j : members(c)) names.emplace_back(rewrite.name(j));
      r.warnings.push_back(fmt::format("{}: {} values beyond float16's range became infinity",
                                       JoinNames(names), rewrite.overflow()[c]));
    }
  }
  return r;
}

// ---- safetensors ----

// One safetensors tensor: what it is in the input and what it becomes.
struct TensorConversion {
  const safetensors::TensorEntry* in;
  safetensors::OutTensor out;
  bool convert = false;
  uint32_t crc = 0;
  uint64_t overflow = 0;
};

ConvertResult ConvertSafetensors(CheckpointFile& f, const std::string& output,
                                 const ConvertOptions& o, ConvertResult r) {
  const safetensors::File& st = *f.st;
  std::vector<TensorConversion> plan;
  // What each selected float32 tensor's values would lose, measured on every thread.
  std::vector<kernels::ConversionLoss> loss(st.tensors.size());
  std::vector<bool> selected(st.tensors.size(), false);
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const safetensors::TensorEntry& e = st.tensors[i];
    selected[i] =
        e.dtype == "F32" && SelectedForConversion(torch::NameList{e.name}, e.shape.size(), o);
  }
  ParallelFor(st.tensors.size(), o.threads, [&](size_t i) {
    if (!selected[i]) return;
    const safetensors::TensorEntry& e = st.tensors[i];
    Bytes span = Slice(f.map.bytes(), st.data_offset + e.begin, e.end - e.begin);
    loss[i] = kernels::MeasureLoss(o.to, span.data(), span.size() / 4);
  });
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const safetensors::TensorEntry& e = st.tensors[i];
    TensorConversion p;
    p.in = &e;
    p.out = {e.name, e.dtype, e.shape, e.end - e.begin};
    if (e.dtype == "F32") {
      std::string why = selected[i] ? loss[i].Reason(o.to) : "";
      if (selected[i] && (why.empty() || o.lossy)) {
        p.convert = true;
        p.out.dtype = torch::Info(torch::DTypeOf(o.to)).safetensors;
        p.out.size /= 2;
        r.converted++;
        if (!why.empty()) r.lost_precision.push_back(e.name + ": " + why);
      } else {
        r.kept_float32++;
        if (!why.empty()) r.kept.push_back(e.name + ": " + why);
      }
    }
    plan.push_back(std::move(p));
  }
  // Wider elements first keeps every tensor aligned to its element size.
  std::stable_sort(
      plan.begin(), plan.end(), [](const TensorConversion& a, const TensorConversion& b) {
        return safetensors::DTypeBits(a.out.dtype) > safetensors::DTypeBits(b.out.dtype);
      });
  std::vector<safetensors::OutTensor> outs;
  for (const TensorConversion& p : plan) outs.push_back(p.out);
  safetensors::Layout layout = safetensors::LayOut(outs, st.metadata);
  if (o.dry_run) {
    r.after = layout.total_size;
    return r;
  }
  PerfTimer timer("write");
  AtomicOutput out = AtomicOutput::Create(output, layout.total_size);
  out.RequireUnchanged(f.map);
  out.Write(0, AsBytes(layout.header));
  std::vector<uint64_t> sizes;
  for (const TensorConversion& p : plan) sizes.push_back(p.out.size);
  std::mutex mutex;
  CheckedRanges checked(plan.size());  // pieces read back as they land
  std::vector<uint32_t> crcs =
      ParallelCrc(sizes, o.threads, kCrcPiece, [&](size_t i, uint64_t off, uint64_t len) {
        TensorConversion& p = plan[i];
        uint64_t scale = p.convert ? 2 : 1;
        uint64_t overflow = 0;
        uint32_t crc = checked.Write(out, i, [&] {
          return WriteRange(out, layout.offsets[i] + off, f.map,
                            st.data_offset + p.in->begin + off * scale, len * scale,
                            p.convert ? std::optional(o.to) : std::nullopt, &overflow);
        });
        if (overflow) {
          std::lock_guard<std::mutex> lock(mutex);
          p.overflow += overflow;
        }
        if (o.bytes_done) *o.bytes_done += len * scale;
        return crc;
      });
  out.SetMode(f.map.mode(), f.map.uid(), f.map.gid());
  out.Sync();
  // Verify: the new file passes the reader's rules, every tensor is where it was written,
  // and the bytes of those not read back as they were written hash to what was computed from
  // the input while writing.
  MappedFile written = MappedFile::Open(out.temp_path());
  WithContext(fmt::format("{}: verifying the new file failed, nothing was written", f.path), [&] {
    PerfTimer verify("verify");
    safetensors::File back = safetensors::Parse(written.bytes());
    if (back.tensors.size() != plan.size()) Fail("tensor count differs");
    CrcChecks reread;
    for (size_t i = 0; i < plan.size(); ++i) {
      const safetensors::TensorEntry& e = back.tensors[i];
      if (e.name != plan[i].out.name || e.dtype != plan[i].out.dtype ||
          !std::equal(e.shape.begin(), e.shape.end(), plan[i].out.shape.begin(),
                      plan[i].out.shape.end())) {
        Fail("tensor '{}' changed", plan[i].out.name);
      }
      if (back.data_offset + e.begin != layout.offsets[i] || e.end - e.begin != plan[i].out.size)
        Fail("tensor '{}' is not where it was written", e.name);
      if (!checked.checked(i)) reread.Add(back.data_offset + e.begin, e.end - e.begin, crcs[i], i);
    }
    reread.Run(written, o.threads, [&](size_t i) {
      Fail("tensor '{}' does not hold the bytes written", plan[i].out.name);
    });
  });
  out.Commit();
  r.after = layout.total_size;
  for (const TensorConversion& p : plan) {
    r.storage_bytes += p.out.size;
    if (p.overflow) {
      r.warnings.push_back(fmt::format("{}: {} values beyond float16's range became infinity",
                                       p.out.name, p.overflow));
    }
  }
  return r;
}

}  // namespace

bool SelectedForConversion(const torch::NameList& names, size_t rank, const ConvertOptions& o) {
  if (o.keep_1d && rank == 1) return false;
  bool only = o.only.empty();
  for (std::string_view view : names) {
    std::string n(view);
    if (MatchesAnyGlob(o.keep, n)) return false;
    if (!only && MatchesAnyGlob(o.only, n)) only = true;
  }
  return only;
}

ConvertResult ConvertFile(const std::string& path, const std::string& output,
                          const ConvertOptions& o) {
  std::error_code ec;
  if (std::filesystem::equivalent(path, output, ec)) {
    Fail("{}: convert never overwrites its input; choose another output", path);
  }
  ConvertResult r;
  r.path = path;
  r.output = output;
  CheckpointFile f = OpenCheckpoint(path);
  r.before = f.map.size();
  if (f.torch) return ConvertTorch(f, output, o, std::move(r));
  return ConvertSafetensors(f, output, o, std::move(r));
}

}  // namespace ckpt
