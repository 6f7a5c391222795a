// How CPython's C unpickler (Modules/_pickle.c) takes bytes from a file object, and the two
// ways ckptool can follow it. See docs/pickle-parity.md for the source it follows.
//
// _pickle.c keeps an input buffer. Outside a FRAME the buffer is empty and every read asks
// the file for exactly what the opcode needs (io.BytesIO, which torch.load hands data.pkl
// to, has no peek()). FRAME n reads n bytes from the file into the buffer
// (load_frame), and opcodes are then served from the buffer while they fit. A read that does
// not fit (_Unpickler_ReadImpl -> _Unpickler_ReadFromFile) DROPS the unread rest of the
// buffer and reads from the file, which is already past the frame; a line that does not end
// in the buffer (_Unpickler_Readline) likewise drops it and reads a line from the file. Only
// the payload of BINBYTES, SHORT_BINBYTES, BINBYTES8 and BYTEARRAY8 (_Unpickler_ReadInto)
// takes the rest of the buffer and continues in the file, as a straight reader would.
//
// A straight reader and _pickle.c therefore agree exactly when every read and every line
// that starts inside a frame also ends inside it (or, for the byte payloads above, anywhere),
// and no FRAME starts before the previous frame's bytes were all read. That is what
// pickle.py's own unpickler enforces and what every pickler writes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/byte_cursor.h"
#include "base/error.h"

namespace ckpt::pickle {

// Thrown in kStrict mode where a straight reading and _pickle.c's differ.
class FrameDivergence : public Error {
 public:
  using Error::Error;
};

enum class FrameMode : uint8_t {
  kStrict,    // refuse (throw) where a straight reader and _pickle.c would read differently
  kStraight,  // frames are only headers: read straight through, as pickletools does
  kBytesIO,   // read as _pickle.c reads an io.BytesIO: what torch.load runs for data.pkl
};

class StreamReader {
 public:
  StreamReader(Bytes data, uint64_t base, FrameMode mode) : data_(data), base_(base), mode_(mode) {}

  uint64_t pos() const { return pos_; }
  uint64_t file_pos() const { return base_ + pos_; }
  uint64_t remaining() const { return data_.size() - pos_; }
  // Bytes of the current frame not read yet (0 outside a frame).
  uint64_t frame_left() const { return in_frame_ ? frame_end_ - pos_ : 0; }

  // _Unpickler_Read: opcodes, their fixed-size arguments, and counted strings.
  Bytes Read(uint64_t n);
  // _Unpickler_ReadInto: the payload of the bytes opcodes.
  Bytes ReadInto(uint64_t n);
  // _Unpickler_Readline: up to '\n'; returns the line without it.
  std::string_view ReadLine();
  // load_frame, after the 8-byte length was read with Read().
  void StartFrame(uint64_t n);
  // Called before each opcode: where the frame it starts in ends (for ReadInto).
  void BeginOpcode() { op_frame_end_ = in_frame_ ? frame_end_ : 0; }
  // Reads _pickle.c and a straight reader agree on but no pickler writes (an opcode whose data
  // the end of its frame splits off).
  std::vector<std::string>& anomalies() { return anomalies_; }

  uint8_t ReadU8() { return Read(1)[0]; }
  template <typename T>
  T ReadLE() {
    return LoadLE<T>(Read(sizeof(T)).data());
  }
  template <typename T>
  T ReadBE() {
    return LoadBE<T>(Read(sizeof(T)).data());
  }

 private:
  [[noreturn]] void Diverges(std::string_view what) const;
  Bytes Take(uint64_t n);  // n bytes at pos_, bounds checked
  void LeaveFrameIfDone() {
    if (in_frame_ && pos_ == frame_end_) in_frame_ = false;
  }

  Bytes data_;
  uint64_t base_ = 0;
  FrameMode mode_;
  uint64_t pos_ = 0;
  bool in_frame_ = false;
  uint64_t frame_end_ = 0;  // where the file is while a frame is being read
  uint64_t op_frame_end_ = 0;
  std::vector<std::string> anomalies_;
};

}  // namespace ckpt::pickle
