// Parallel work whose results must be used in order (archive chunks appended one after the
// other, a file streamed to stdout): work(i) runs on any of `threads` workers, emit(i) runs
// for i = 0, 1, 2... as soon as item i and everything before it are done, one at a time.
// At most `window` items are between the oldest not yet emitted and the newest started, so
// memory stays at `window` result slots whatever the input size. The first exception stops
// the others from starting new items and is rethrown once all workers have stopped.
#pragma once

#include <cstddef>
#include <functional>

namespace ckpt::ckz {

// work(item, worker, slot): worker in [0, threads) (for per-thread state), slot in
// [0, window) (for the result). emit(item, slot).
void OrderedPipeline(size_t items, unsigned threads, size_t window,
                     const std::function<void(size_t, unsigned, size_t)>& work,
                     const std::function<void(size_t, size_t)>& emit);

}  // namespace ckpt::ckz

namespace ckpt::ckz {

// fn(item, worker) for every item in [0, items), on up to `threads` threads; worker in
// [0, threads) indexes per-thread state. The first exception stops the others from starting
// new items and is rethrown after all have joined.
void ParallelWorkers(size_t items, unsigned threads,
                     const std::function<void(size_t, unsigned)>& fn);

}  // namespace ckpt::ckz
