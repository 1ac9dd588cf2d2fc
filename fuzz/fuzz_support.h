// How the fuzz targets cut their input into pieces, shared with the seed
// corpus generator (make_corpus.cc) so that the two always agree.
//
// Numbers are little-endian; a record is a u16 length and that many bytes.
// Past the end of the input every number reads as 0 and every byte string
// as empty, so any input is a valid one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace plexus::fuzz {

class InputReader {
 public:
  InputReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }
  size_t remaining() const { return empty() ? 0 : size_ - pos_; }

  uint8_t U8() { return static_cast<uint8_t>(Number(1)); }
  uint16_t U16() { return static_cast<uint16_t>(Number(2)); }
  uint32_t U32() { return static_cast<uint32_t>(Number(4)); }
  uint64_t U64() { return Number(8); }
  // Up to `n` bytes (fewer at the end of the input).
  std::string Bytes(size_t n) {
    n = n < remaining() ? n : remaining();
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  std::string Record() { return Bytes(U16()); }
  std::string Rest() { return Bytes(remaining()); }

 private:
  uint64_t Number(int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes && !empty(); ++i) {
      v |= static_cast<uint64_t>(data_[pos_++]) << (8 * i);
    }
    return v;
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// The inverse of InputReader, for writing seed inputs.
class InputWriter {
 public:
  InputWriter& U8(uint8_t v) { return Number(v, 1); }
  InputWriter& U16(uint16_t v) { return Number(v, 2); }
  InputWriter& U32(uint32_t v) { return Number(v, 4); }
  InputWriter& U64(uint64_t v) { return Number(v, 8); }
  InputWriter& Bytes(const std::string& bytes) {
    out_ += bytes;
    return *this;
  }
  InputWriter& Bytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
    return *this;
  }
  InputWriter& Record(const std::string& bytes) {
    return U16(static_cast<uint16_t>(bytes.size())).Bytes(bytes);
  }
  const std::string& str() const { return out_; }

 private:
  InputWriter& Number(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i)
      out_.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }

  std::string out_;
};

}  // namespace plexus::fuzz
