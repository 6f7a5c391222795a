#include "pickle/graph_digest.h"

#include <xxhash.h>

#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <vector>

namespace ckpt::pickle {

namespace {

// The graph as a token stream, hashed as it is produced: a node seen for the first time is its
// kind, its value and its child counts (its children follow, in a fixed order); a node seen
// before is a back-reference to its position in the order of first visits. Two streams are
// equal exactly when the graphs are equal with the same sharing.
class Digester {
 public:
  explicit Digester(const Graph& g) : g_(g), order_(g.nodes.size(), kNil) {
    if (!state_) throw std::bad_alloc();
    XXH3_128bits_reset(state_.get());
  }

  GraphDigest Run(NodeId root) {
    std::vector<NodeId> work{root};
    while (!work.empty()) {
      NodeId p = work.back();
      work.pop_back();
      if (p == kNil) {
        Put<uint8_t>(kNilTag);
        continue;
      }
      if (order_[p] != kNil) {
        Put<uint8_t>(kBackTag);
        Put<uint32_t>(order_[p]);
        continue;
      }
      order_[p] = next_++;
      Shallow(p);
      if (!g_.has_compound(p)) continue;
      const Compound& c = g_.compound(p);
      std::span<const NodeId> items = g_.items(p), pairs = g_.pairs(p), states = g_.states(p);
      Put<uint8_t>(static_cast<uint8_t>(c.construct));
      Put<uint32_t>(static_cast<uint32_t>(items.size()));
      Put<uint32_t>(static_cast<uint32_t>(pairs.size()));
      Put<uint32_t>(static_cast<uint32_t>(states.size()));
      work.insert(work.end(), items.begin(), items.end());
      work.insert(work.end(), pairs.begin(), pairs.end());
      work.insert(work.end(), states.begin(), states.end());
      work.push_back(c.callable);
      work.push_back(c.args);
      work.push_back(c.kwargs);
    }
    Flush();
    XXH128_hash_t h = XXH3_128bits_digest(state_.get());
    return {h.low64, h.high64};
  }

 private:
  static constexpr uint8_t kNilTag = 0xff;
  static constexpr uint8_t kBackTag = 0xfe;
  static constexpr size_t kBuffer = 64 << 10;

  void Shallow(NodeId p) {
    const Node& n = g_.at(p);
    Put<uint8_t>(static_cast<uint8_t>(n.kind));
    switch (n.kind) {
      case Kind::kBool:
        Put<uint8_t>(n.boolean ? 1 : 0);
        break;
      case Kind::kInt:
        Put<int64_t>(n.integer);
        break;
      case Kind::kFloat:
        Put<double>(n.real);  // its bits: -0.0 and NaN payloads count
        break;
      case Kind::kGlobal:
        PutText(g_.global_module(p));
        PutText(g_.global_name(p));
        break;
      case Kind::kBigInt:
      case Kind::kStr:
      case Kind::kBytes:
      case Kind::kByteArray:
        PutText(g_.text(p));
        break;
      default:
        break;
    }
  }

  template <typename T>
  void Put(T value) {
    if (used_ + sizeof value > kBuffer) Flush();
    std::memcpy(buffer_.data() + used_, &value, sizeof value);
    used_ += sizeof value;
  }
  void PutText(std::string_view text) {
    Put<uint64_t>(text.size());
    if (used_ + text.size() > kBuffer) {
      Flush();
      if (text.size() > kBuffer) {
        XXH3_128bits_update(state_.get(), text.data(), text.size());
        return;
      }
    }
    std::memcpy(buffer_.data() + used_, text.data(), text.size());
    used_ += text.size();
  }
  void Flush() {
    XXH3_128bits_update(state_.get(), buffer_.data(), used_);
    used_ = 0;
  }

  struct FreeState {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };

  const Graph& g_;
  std::vector<NodeId> order_;  // per node: its position in the order of first visits
  NodeId next_ = 0;
  std::unique_ptr<XXH3_state_t, FreeState> state_{XXH3_createState()};
  std::vector<char> buffer_ = std::vector<char>(kBuffer);
  size_t used_ = 0;
};

}  // namespace

GraphDigest DigestGraph(const Graph& g, NodeId root) {
  return Digester(g).Run(root);
}

}  // namespace ckpt::pickle
