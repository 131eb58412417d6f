#include "engine/weights/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/cpu/quant.h"

namespace kiln::engine {

const char* dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f32: return "F32";
    case Dtype::f16: return "F16";
    case Dtype::bf16: return "BF16";
    case Dtype::q8: return "Q8";
    case Dtype::q4: return "Q4";
    default: return "unsupported";
  }
}
size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::f32: return 4;
    case Dtype::f16:
    case Dtype::bf16: return 2;
    default: return 0;
  }
}
size_t dtype_row_bytes(Dtype d, int64_t cols) {
  if (d == Dtype::q8) return cpu::row_bytes(cpu::WeightFormat::q8, cols);
  if (d == Dtype::q4) return cpu::row_bytes(cpu::WeightFormat::q4, cols);
  return size_t(cols) * dtype_size(d);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) { man <<= 1; --exp; }
      u = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (man << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void to_f32(Dtype dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case Dtype::f32: std::memcpy(dst, src, size_t(n) * 4); break;
    case Dtype::bf16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      break;
    }
    case Dtype::f16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
    case Dtype::q8: cpu::dequantize_row_ref(cpu::WeightFormat::q8, static_cast<const uint8_t*>(src), dst, n); break;
    case Dtype::q4: cpu::dequantize_row_ref(cpu::WeightFormat::q4, static_cast<const uint8_t*>(src), dst, n); break;
    default: std::fill(dst, dst + n, 0.0f);
  }
}

Result<std::unique_ptr<MappedFile>> MappedFile::open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    std::string e = std::strerror(errno);
    ::close(fd);
    return make_error(path + ": cannot stat: " + e);
  }
  std::unique_ptr<MappedFile> f(new MappedFile());
  f->path_ = path;
  f->size_ = size_t(st.st_size);
  f->mtime_ns_ = uint64_t(st.st_mtim.tv_sec) * 1000000000ull + uint64_t(st.st_mtim.tv_nsec);
  f->inode_ = uint64_t(st.st_ino);
  if (f->size_ > 0) {
    void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      std::string e = std::strerror(errno);
      ::close(fd);
      return make_error(path + ": cannot mmap: " + e);
    }
    f->data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  return f;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
std::string TensorInfo::shape_string() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

static Dtype parse_dtype(const std::string& s) {
  if (s == "F32") return Dtype::f32;
  if (s == "F16") return Dtype::f16;
  if (s == "BF16") return Dtype::bf16;
  return Dtype::unsupported;
}

static size_t stored_size(const std::string& s) {  // element size of any safetensors dtype
  if (s == "F64" || s == "I64" || s == "U64") return 8;
  if (s == "F32" || s == "I32" || s == "U32") return 4;
  if (s == "F16" || s == "BF16" || s == "I16" || s == "U16") return 2;
  return 1;  // I8, U8, BOOL, F8_*
}

// A JSON array of non-negative integers (shape, data_offsets). A float or a negative number would
// otherwise be cast by get<> (undefined for 1e30, a huge value for -128).
static bool read_counts(const nlohmann::json& v, std::vector<uint64_t>& out) {
  if (!v.is_array()) return false;
  for (const auto& e : v) {
    if (e.is_number_unsigned()) out.push_back(e.get<uint64_t>());
    else if (e.is_number_integer() && e.get<int64_t>() >= 0) out.push_back(uint64_t(e.get<int64_t>()));
    else return false;
  }
  return true;
}

Status Checkpoint::add_file(const std::string& path) {
  auto mapped = MappedFile::open(path);
  if (!mapped) return make_error(mapped.error());
  const MappedFile& f = **mapped;
  if (f.size() < 8) return make_error(path + ": truncated file (" + std::to_string(f.size()) + " bytes, no header)");
  uint64_t header_len = 0;
  std::memcpy(&header_len, f.data(), 8);
  if (header_len > f.size() - 8)
    return make_error(path + ": truncated file: header of " + std::to_string(header_len) +
                      " bytes does not fit in " + std::to_string(f.size()) + " bytes");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(f.data() + 8, f.data() + 8 + header_len);
  } catch (const nlohmann::json::exception& e) {
    return make_error(path + ": safetensors header is not valid JSON: " + e.what());
  }
  if (!header.is_object()) return make_error(path + ": safetensors header is not a JSON object");
  const uint8_t* base = f.data() + 8 + header_len;
  const size_t payload = f.size() - 8 - header_len;
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const auto& v = it.value();
    TensorInfo t;
    t.name = it.key();
    t.file = path;
    const std::string where = path + ": tensor " + t.name;
    if (!v.is_object()) return make_error(where + ": malformed header entry " + v.dump());
    auto dtype = v.find("dtype");
    if (dtype == v.end() || !dtype->is_string()) return make_error(where + ": dtype is missing or not a string");
    t.dtype_string = dtype->get<std::string>();
    std::vector<uint64_t> shape, off;
    if (!v.contains("shape") || !read_counts(v["shape"], shape))
      return make_error(where + ": shape must be a list of non-negative integers, not " +
                        (v.contains("shape") ? v["shape"].dump() : std::string("missing")));
    // numel and the byte size are checked products: a huge shape would wrap (signed overflow).
    uint64_t numel = 1, needed = 0;
    for (uint64_t d : shape)
      if (d > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, d, &numel) || numel > uint64_t(INT64_MAX))
        return make_error(where + ": shape " + v["shape"].dump() + " has more elements than fit in 64 bits");
    if (__builtin_mul_overflow(numel, uint64_t(stored_size(t.dtype_string)), &needed))
      return make_error(where + ": shape " + v["shape"].dump() + " needs more bytes than fit in 64 bits");
    for (uint64_t d : shape) t.shape.push_back(int64_t(d));
    if (!v.contains("data_offsets") || !read_counts(v["data_offsets"], off) || off.size() != 2 || off[0] > off[1])
      return make_error(where + ": bad data_offsets " +
                        (v.contains("data_offsets") ? v["data_offsets"].dump() : std::string("(missing)")));
    if (off[1] > payload)
      return make_error(path + ": truncated file: tensor " + t.name + " data ends at byte " +
                        std::to_string(off[1]) + " of a " + std::to_string(payload) + "-byte payload");
    t.data = base + off[0];
    t.nbytes = off[1] - off[0];
    t.dtype = parse_dtype(t.dtype_string);
    if (needed != t.nbytes)
      return make_error(where + " " + t.shape_string() + " " + t.dtype_string + " needs " + std::to_string(needed) +
                        " bytes but has " + std::to_string(t.nbytes));
    if (tensors_.count(t.name))
      return make_error(path + ": tensor " + t.name + " also appears in " + tensors_[t.name].file);
    auto placed = tensors_.emplace(t.name, std::move(t)).first;
    if (off[1] > off[0]) ranges.push_back({off[0], off[1], &placed->first});
  }
  // Each tensor owns its bytes (safetensors writes them back to back): overlapping ranges are a
  // corrupt or hostile header, and would make two weights alias each other.
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      return make_error(path + ": tensors " + *ranges[i - 1].name + " and " + *ranges[i].name +
                        " overlap (bytes " + std::to_string(ranges[i - 1].begin) + ".." +
                        std::to_string(ranges[i - 1].end) + " and " + std::to_string(ranges[i].begin) + ".." +
                        std::to_string(ranges[i].end) + ")");
  files_.push_back(std::move(mapped).value());
  return {};
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_files(const std::vector<std::string>& paths) {
  std::unique_ptr<Checkpoint> c(new Checkpoint());
  for (const auto& p : paths) {
    Status s = c->add_file(p);
    if (!s) return make_error(s.error());
  }
  return c;
}

Result<std::unique_ptr<Checkpoint>> Checkpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code ec;
  if (fs::exists(index, ec)) {
    std::ifstream in(index);
    nlohmann::json j;
    try {
      in >> j;
    } catch (const nlohmann::json::exception& e) {
      return make_error(index.string() + ": not valid JSON: " + e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      return make_error(index.string() + ": no weight_map object");
    std::set<std::string> shards;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        return make_error(index.string() + ": weight_map entry \"" + it.key() + "\" is " + it.value().dump() +
                          ", not a shard file name");
      // A shard is a file of this model directory: an absolute path or a ".." would let an index
      // read any file (symlinks inside the directory, as the HF cache uses, are followed as usual).
      const std::string shard = it.value().get<std::string>();
      const fs::path rel(shard);
      bool escapes = rel.empty() || rel.has_root_path();
      for (const fs::path& part : rel) escapes = escapes || part == "..";
      if (escapes)
        return make_error(index.string() + ": weight_map entry \"" + it.key() + "\" names shard \"" + shard +
                          "\", which is not a file inside the model directory");
      shards.insert(shard);
    }
    for (const auto& s : shards) files.push_back((fs::path(dir) / s).string());
    auto c = open_files(files);
    if (!c) return c;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
      if (!(*c)->find(it.key()))
        return make_error(index.string() + ": lists tensor " + it.key() + " in " + it.value().get<std::string>() +
                          ", which does not contain it");
    return c;
  }
  if (!fs::is_directory(dir, ec)) return make_error(dir + ": not a directory");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty()) return make_error(dir + ": no *.safetensors files and no model.safetensors.index.json");
  return open_files(files);
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace kiln::engine
