#include "pickle/stream_reader.h"

#include <fmt/format.h>

#include "base/error.h"

namespace ckpt::pickle {

void StreamReader::Diverges(std::string_view what) const {
  uint64_t left = frame_end_ - pos_;
  throw FrameDivergence(fmt::format(
      "pickle offset {}: a FRAME ends {} byte{} into {}: torch.load (CPython's unpickler reading "
      "a file) drops the rest of the frame and reads on after it, so it would run other opcodes "
      "than the ones a straight reading shows; refused",
      file_pos(), left, left == 1 ? "" : "s", what));
}

Bytes StreamReader::Take(uint64_t n) {
  if (n > remaining()) {
    Fail("unexpected end of data at offset {}: need {} bytes, {} left", file_pos(), n, remaining());
  }
  Bytes out = data_.subspan(pos_, n);
  pos_ += n;
  return out;
}

Bytes StreamReader::Read(uint64_t n) {
  if (in_frame_ && n > frame_end_ - pos_) {
    if (mode_ == FrameMode::kStrict) Diverges(fmt::format("a {}-byte read", n));
    if (mode_ == FrameMode::kBytesIO) pos_ = frame_end_;  // the buffer's rest is dropped
    in_frame_ = false;
  }
  Bytes out = Take(n);
  LeaveFrameIfDone();
  return out;
}

Bytes StreamReader::ReadInto(uint64_t n) {
  // The rest of the buffer, then the file: the same bytes as a straight reading, but pickle.py
  // refuses it, and picklers write large data outside frames, header and all.
  if (op_frame_end_ != 0 && n > 0 && pos_ + n > op_frame_end_ && anomalies_.size() < 16) {
    anomalies_.push_back(fmt::format(
        "pickle offset {}: a FRAME ends inside an opcode, between it and its {} bytes of data: "
        "no pickler writes that (pickle.py refuses it)",
        file_pos(), n));
  }
  if (in_frame_ && n > frame_end_ - pos_) in_frame_ = false;
  Bytes out = Take(n);
  LeaveFrameIfDone();
  return out;
}

std::string_view StreamReader::ReadLine() {
  if (in_frame_) {
    for (uint64_t i = pos_; i < frame_end_; ++i) {
      if (data_[i] == '\n') {
        std::string_view line = AsText(data_.subspan(pos_, i - pos_));
        pos_ = i + 1;
        LeaveFrameIfDone();
        return line;
      }
    }
    if (mode_ == FrameMode::kStrict) Diverges("a line (no newline before the frame's end)");
    if (mode_ == FrameMode::kBytesIO) pos_ = frame_end_;  // readline() from the file
    in_frame_ = false;
  }
  for (uint64_t i = pos_; i < data_.size(); ++i) {
    if (data_[i] == '\n') {
      std::string_view line = AsText(data_.subspan(pos_, i - pos_));
      pos_ = i + 1;
      return line;
    }
  }
  Fail("unexpected end of data at offset {}: unterminated line", file_pos());
}

void StreamReader::StartFrame(uint64_t n) {
  if (in_frame_) {
    // _pickle.c: a frame that fits in what is left of the buffer changes nothing; one that
    // does not drops the buffer's rest. pickle.py refuses both; no pickler writes either.
    if (mode_ == FrameMode::kStrict) {
      throw FrameDivergence(
          fmt::format("pickle offset {}: a FRAME starts {} bytes before the previous frame ends; "
                      "unpicklers disagree on what follows; refused",
                      file_pos(), frame_end_ - pos_));
    }
    if (mode_ == FrameMode::kStraight || n <= frame_end_ - pos_) {
      if (n > remaining()) Take(n);  // the error
      return;
    }
    pos_ = frame_end_;
    in_frame_ = false;
  }
  if (n > remaining()) {
    Fail("pickle offset {}: FRAME of {} bytes is larger than the {} bytes left", file_pos(), n,
         remaining());
  }
  if (mode_ == FrameMode::kStraight) return;
  in_frame_ = n > 0;
  frame_end_ = pos_ + n;
}

}  // namespace ckpt::pickle
