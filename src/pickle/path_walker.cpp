#include "pickle/path_walker.h"

#include "base/error.h"

namespace ckpt::pickle {

PathWalker::PathWalker(const Graph& g)
    : g_(g), on_path_(g.nodes.size(), false), walked_(g.nodes.size(), kUnseen) {}

void PathWalker::Run(NodeId root, Client& client) {
  client_ = &client;
  stopped_ = false;
  Walk(root);
  client_ = nullptr;
}

bool PathWalker::Probe(NodeId n, Client& client) {
  Client* outer_client = client_;
  bool outer_marking = marking_, outer_stopped = stopped_;
  client_ = &client;
  marking_ = false;
  stopped_ = false;
  Walk(n);
  bool stopped = stopped_;
  client_ = outer_client;
  marking_ = outer_marking;
  stopped_ = outer_stopped;
  return stopped;
}

void PathWalker::EnterLevel() {
  if (stack_depth_ > kMaxDepth) Fail("object graph nested deeper than {} levels", kMaxDepth);
  ++stack_depth_;
}

void PathWalker::Walk(NodeId n) {
  if (stopped_) return;
  // Scalars, a cycle back to a node on the path, a node pruned: one step, nothing to walk.
  if (n == kNil || !g_.has_compound(n) || on_path_[n] || walked_[n] == kPruned) {
    budget_.Step();
    return;
  }
  EnterLevel();
  bool first = walked_[n] == kUnseen;
  bool outer = budget_.Enter(!first);
  if (marking_) walked_[n] = kWalked;
  on_path_[n] = true;
  client_->Node(n, first);
  on_path_[n] = false;
  --stack_depth_;
  budget_.Leave(outer);
}

void PathWalker::Child(NodeId n, std::string_view key) {
  Key k(*this, key);
  Walk(n);
}

void PathWalker::Entries(NodeId n) {
  std::span<const NodeId> pairs = g_.pairs(n);
  for (size_t i = 0; i + 1 < pairs.size() && !stopped_; i += 2) {
    Child(pairs[i + 1], g_.KeyText(pairs[i]));
  }
}

void PathWalker::Entries(NodeId n, const Judge& judge) {
  std::span<const NodeId> pairs = g_.pairs(n);
  std::vector<bool> walk(pairs.size() / 2, false);
  for (size_t i = 0; i + 1 < pairs.size() && !stopped_; i += 2) {
    budget_.Step();
    Key k(*this, g_.KeyText(pairs[i]));
    walk[i / 2] = judge(i);
  }
  for (size_t i = 0; i + 1 < pairs.size() && !stopped_; i += 2) {
    if (walk[i / 2]) Child(pairs[i + 1], g_.KeyText(pairs[i]));
  }
}

void PathWalker::Items(NodeId n) {
  std::span<const NodeId> items = g_.items(n);
  for (size_t i = 0; i < items.size() && !stopped_; ++i) Child(items[i], std::to_string(i));
}

void PathWalker::Items(NodeId n, const Judge& judge) {
  std::span<const NodeId> items = g_.items(n);
  std::vector<bool> walk(items.size(), false);
  for (size_t i = 0; i < items.size() && !stopped_; ++i) {
    budget_.Step();
    Key k(*this, std::to_string(i));
    walk[i] = judge(i);
  }
  for (size_t i = 0; i < items.size() && !stopped_; ++i) {
    if (walk[i]) Child(items[i], std::to_string(i));
  }
}

void PathWalker::States(NodeId n, StateParts parts) {
  if (g_.kind(n) != Kind::kObject) return;
  for (NodeId state : g_.states(n)) {
    if (stopped_) return;
    bool tuple = g_.kind(state) == Kind::kTuple;
    if (tuple && parts == StateParts::kAtObjectPath) {
      for (NodeId part : g_.items(state)) Walk(part);
    } else if (tuple && g_.items(state).size() == 2) {
      for (NodeId part : g_.items(state)) {
        if (g_.kind(part) == Kind::kDict) {
          Walk(part);
        } else if (g_.kind(part) != Kind::kNone) {
          Child(part, "__state__");
        }
      }
    } else {
      Walk(state);
    }
  }
}

void PathWalker::CallArguments(NodeId n) {
  if (g_.kind(n) != Kind::kObject) return;
  const Compound& c = g_.compound(n);
  if (c.args != kNil && g_.kind(c.args) == Kind::kTuple) {
    std::span<const NodeId> args = g_.items(c.args);
    for (size_t i = 0; i < args.size() && !stopped_; ++i) Child(args[i], std::to_string(i));
  }
  if (c.kwargs != kNil) Walk(c.kwargs);
}

PathWalker::Key::Key(PathWalker& w, std::string_view key)
    : w_(w), path_size_(w.path_.size()), top_size_(w.top_size_) {
  w_.budget_.PathBytes(key.size());
  if (w_.path_.empty()) {
    w_.top_size_ = key.size();
  } else {
    w_.path_.push_back('.');
  }
  w_.path_.append(key);
  ++w_.key_depth_;
}

PathWalker::Key::~Key() {
  w_.path_.resize(path_size_);
  w_.top_size_ = top_size_;
  --w_.key_depth_;
}

PathWalker::Deeper::Deeper(PathWalker& w) : w_(w) {
  w_.EnterLevel();
}

}  // namespace ckpt::pickle
