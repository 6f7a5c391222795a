#include "cluster/steps.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <set>

#include "base/utf8.h"
#include "cluster/world.h"

namespace ckpt::cluster {

namespace {

using Json = nlohmann::json;

enum Step { kAgree, kCollect, kDecide, kConfirm, kFinish, kDone };
// Per thread: a process that embeds the engine (the Python package) runs commands in several
// threads at once, each with its own steps (never under MPI).
thread_local Step g_next = kAgree;
thread_local std::vector<std::string> g_kept;  // errors of this rank not yet sent to rank 0
thread_local std::set<std::string>
    g_printed;  // on rank 0: every error printed, its own and relayed

// Step messages are CBOR: byte-exact for paths and messages that are not UTF-8.
std::string Encode(const Json& j) {
  std::vector<uint8_t> bytes = Json::to_cbor(j);
  return std::string(bytes.begin(), bytes.end());
}
Json Decode(const std::string& s) {
  return Json::from_cbor(s);
}

Json Binary(const std::string& s) {
  return Json::binary(std::vector<uint8_t>(s.begin(), s.end()));
}
std::string FromBinary(const Json& j) {
  const auto& b = j.get_binary();
  return std::string(b.begin(), b.end());
}

Json Message(bool ok) {
  Json m = {{"ok", ok}, {"errors", g_kept}};
  g_kept.clear();
  return m;
}

// On rank 0: prints what another rank could not.
void Relay(int rank, const Json& errors) {
  for (const std::string& e : errors.get<std::vector<std::string>>()) {
    if (g_printed.count(e)) continue;
    std::string line = fmt::format("rank {} of {}: {}", rank, Size(), e);
    if (!g_printed.insert(line).second) continue;
    std::fflush(stdout);
    std::fprintf(stderr, "ckptool: error: %s\n", Printable(line).c_str());
  }
}

void Expect(Step step) {
  if (g_next != step) AbortJob(fmt::format("internal: cluster step {} out of order", int(step)), 1);
  g_next = static_cast<Step>(step + 1);
}

// Step 1 on every rank; returns 0 to go on, else the exit code to stop with.
int AgreeStep(bool ok, int rc, const std::string& view, const std::string& summary) {
  Expect(kAgree);
  Json m = Message(ok);
  m["rc"] = rc;
  m["view"] = Binary(view);
  m["summary"] = summary;
  std::vector<std::string> all = GatherToRoot(Encode(m));
  int decision = 0;
  if (IsRoot()) {
    std::vector<Json> ms;
    for (const std::string& s : all) ms.push_back(Decode(s));
    bool all_ok = true;
    for (size_t r = 0; r < ms.size(); ++r) {
      Relay(static_cast<int>(r), ms[r]["errors"]);
      if (!ms[r]["ok"].get<bool>()) {
        all_ok = false;
        decision = std::max({decision, ms[r]["rc"].get<int>(), 1});
      }
    }
    for (size_t r = 1; all_ok && r < ms.size(); ++r) {
      if (ms[r]["view"] == ms[0]["view"]) continue;
      auto said = [](const Json& x) {
        std::string s = x["summary"].get<std::string>();
        return s.empty() ? std::string("nothing to share") : s;
      };
      std::string e = fmt::format(
          "rank {} of {} sees other inputs than rank 0 ({}; rank 0: {}): every rank must see "
          "the same files (one shared filesystem, nothing writing there); nothing was written",
          r, Size(), said(ms[r]), said(ms[0]));
      g_printed.insert(e);
      std::fflush(stdout);
      std::fprintf(stderr, "ckptool: error: %s\n", Printable(e).c_str());
      decision = 1;
    }
  }
  return std::stoi(BroadcastFromRoot(std::to_string(decision)));
}

std::vector<RankResult> CollectStep(bool ok, const std::string& payload) {
  Expect(kCollect);
  Json m = Message(ok);
  m["payload"] = Binary(payload);
  std::vector<std::string> all = GatherToRoot(Encode(m));
  std::vector<RankResult> out;
  for (size_t r = 0; r < all.size(); ++r) {
    Json x = Decode(all[r]);
    RankResult rr;
    rr.ok = x["ok"].get<bool>();
    rr.payload = FromBinary(x["payload"]);
    std::vector<std::string> errors = x["errors"].get<std::vector<std::string>>();
    if (!errors.empty()) rr.error = errors.back();
    Relay(static_cast<int>(r), x["errors"]);
    out.push_back(std::move(rr));
  }
  return out;
}

std::string ConfirmStep(bool ok, const std::string& error) {
  Expect(kConfirm);
  Json m = Message(ok);
  m["error"] = error;
  std::vector<std::string> all = GatherToRoot(Encode(m));
  std::string first;
  for (size_t r = 0; r < all.size(); ++r) {
    Json x = Decode(all[r]);
    Relay(static_cast<int>(r), x["errors"]);
    std::string e = x["error"].get<std::string>();
    if (e.empty() && !x["ok"].get<bool>()) e = fmt::format("rank {} of {} failed", r, Size());
    if (first.empty()) first = e;
  }
  return first;
}

}  // namespace

std::string Decide(const std::string& value) {
  Expect(kDecide);
  return Distributed() ? BroadcastFromRoot(value) : value;
}

std::string Confirm(const std::string& error) {
  if (!Distributed()) {
    Expect(kConfirm);
    return error;
  }
  return ConfirmStep(true, error);
}

bool ShouldPrintError(const std::string& message) {
  if (IsRoot()) {
    g_printed.insert(message);
    return true;
  }
  g_kept.push_back(message);
  return false;
}

void Agree(const std::string& view, const std::string& summary) {
  if (!Distributed()) {
    Expect(kAgree);
    return;
  }
  if (int rc = AgreeStep(true, 0, view, summary)) throw Stopped{rc};
}

std::vector<RankResult> Collect(const std::string& payload) {
  if (!Distributed()) {
    Expect(kCollect);
    return {RankResult{true, payload, ""}};
  }
  return CollectStep(true, payload);
}

void BeginCommand() {
  if (Distributed()) AbortJob("internal: commands run one after another only in one process", 1);
  g_next = kAgree;
  g_kept.clear();
  g_printed.clear();
}

int Finish(int rc) {
  if (!Distributed()) {
    g_next = kDone;
    return rc;
  }
  bool ok = rc == 0;
  if (g_next == kAgree) AgreeStep(ok, rc, "", "");
  if (g_next == kCollect) CollectStep(ok, "");
  if (g_next == kDecide) Decide("");
  if (g_next == kConfirm) ConfirmStep(ok, "");
  Expect(kFinish);
  Json m = Message(ok);
  // Errors kept after the last step: one more gather, so that rank 0 can print them.
  std::vector<std::string> all = GatherToRoot(Encode(m));
  for (size_t r = 0; r < all.size(); ++r) Relay(static_cast<int>(r), Decode(all[r])["errors"]);
  return MaxOverRanks(rc);
}

}  // namespace ckpt::cluster
