// Memory-mapped safetensors checkpoints: one file, or shards listed by model.safetensors.index.json.
// Tensors are views into the mapping (never copied); the Checkpoint owns the mappings, so every
// TensorInfo::data pointer lives as long as the Checkpoint. Read-only after open: safe to share
// between threads.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"

namespace kiln::engine {

// q8 and q4 are kiln's block formats (engine/cpu/quant.h): never read from a checkpoint, only made
// by quantizing at load (engine/weights/quantized_weights.h). They have no per-element size.
enum class Dtype { f32, f16, bf16, unsupported, q8, q4 };

const char* dtype_name(Dtype d);
size_t dtype_size(Dtype d);  // bytes per element; 0 for unsupported and the block formats
size_t dtype_row_bytes(Dtype d, int64_t cols);  // bytes of one matrix row, block formats included

// RAII read-only mapping of a whole file.
class MappedFile {
 public:
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Identity of the file when it was opened (fstat): a rewrite changes at least one of these.
  uint64_t mtime_ns() const { return mtime_ns_; }
  uint64_t inode() const { return inode_; }

 private:
  MappedFile() = default;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint64_t mtime_ns_ = 0, inode_ = 0;
  std::string path_;
};

struct TensorInfo {
  std::string name;            // as stored in the file
  std::string file;            // the file it lives in (for error messages)
  std::string dtype_string;    // as stored ("BF16", "F8_E4M3", ...)
  Dtype dtype = Dtype::unsupported;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  int64_t numel() const;
  std::string shape_string() const;
};

// All tensors of a model directory.
class Checkpoint {
 public:
  // Opens `dir`/model.safetensors.index.json if present, else every *.safetensors in `dir`.
  static Result<std::unique_ptr<Checkpoint>> open_dir(const std::string& dir);
  // Opens explicit files (tests).
  static Result<std::unique_ptr<Checkpoint>> open_files(const std::vector<std::string>& paths);

  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<MappedFile>>& files() const { return files_; }  // in open order

 private:
  Status add_file(const std::string& path);
  std::vector<std::unique_ptr<MappedFile>> files_;
  std::map<std::string, TensorInfo> tensors_;
};

// Converts one stored element range to f32 (any supported dtype). For q8/q4, src must be the
// start of a matrix row and n its full length.
void to_f32(Dtype dtype, const void* src, float* dst, int64_t n);

inline float bf16_to_f32(uint16_t v) {
  uint32_t u = uint32_t(v) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
// Round-to-nearest-even (NaN kept NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);

}  // namespace kiln::engine
