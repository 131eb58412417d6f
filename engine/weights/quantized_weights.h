// Weight formats chosen at load: re-stores a bound model's matrices as bf16, q8 or q4
// (engine/cpu/quant.h) and caches the result next to the model so the next load is a memory map.
//
// What is converted (`describe_weight_storage` reports it per tensor family):
//   - the large projections (attention q/k/v/o, GDN in_proj_qkv/in_proj_z/out_proj, MLP, routed
//     and shared experts) and, unless told otherwise, the lm_head: to the chosen format;
//   - the embedding (a row lookup, read one row per token), the router, the shared-expert gate
//     and the GDN in_proj_a/in_proj_b (tiny, and they feed exp/softmax/sigmoid gates): kept as
//     stored.
//
// Cache file: `<model dir>/kiln-weights-<format>-<fingerprint>.bin`, where the fingerprint hashes
// every tensor's name, dtype, shape and sampled bytes (first, middle and last 256 bytes; a full
// content hash would read the whole checkpoint on every load), each shard file's size, mtime (ns)
// and inode (so a rewritten checkpoint, e.g. a fine-tune changing other rows, is re-quantized
// once), the format and the layout version.
// Written to a unique temporary name (mkstemp, flock'ed while written) and renamed, so a crash
// never leaves a half file under the real name. Each load with the cache on tidies the directory:
// temp files of loads that died (unlocked, a minute old), caches of an older layout, and caches
// of the same format and lm_head choice made from an earlier state of the checkpoint. A cache
// that cannot be opened or mapped, or an unwritable model directory, only costs the cache (a
// warning), never the load.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/quant.h"
#include "engine/cpu/thread_pool.h"
#include "engine/status.h"
#include "engine/weights/safetensors.h"
#include "engine/weights/tensor_names.h"

namespace kiln::engine {

struct WeightLoadOptions {
  cpu::WeightFormat format = cpu::WeightFormat::q8;
  bool quantize_lm_head = true;
  bool use_cache = true;     // read and write the cache file next to the model
  bool progress = false;     // a progress bar on stderr while quantizing
};

// Owns the converted bytes (heap, or the mapped cache file) that the ModelWeights now point into.
class StoredWeights {
 public:
  ~StoredWeights();
  StoredWeights(const StoredWeights&) = delete;
  StoredWeights& operator=(const StoredWeights&) = delete;

  bool from_cache() const { return mapped_ != nullptr; }
  const std::string& cache_path() const { return cache_path_; }  // empty: no cache used
  const std::vector<std::string>& warnings() const { return warnings_; }
  uint64_t bytes() const { return bytes_; }

  // Converts the matrices of `w` in place (their views move to the new storage).
  static Result<std::unique_ptr<StoredWeights>> apply(ModelWeights& w, const Checkpoint& checkpoint,
                                                      const std::string& dir, const WeightLoadOptions& options,
                                                      ThreadPool* pool);

 private:
  StoredWeights() = default;
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> heap_;
  std::unique_ptr<MappedFile> mapped_;
  std::string cache_path_;
  std::vector<std::string> warnings_;
  uint64_t bytes_ = 0;
};

// One line per tensor family: how it is stored now and how many bytes it takes.
struct WeightFamilyStorage {
  std::string family;   // "attention q/k/v/o", "experts (routed)", "lm_head", ...
  std::string storage;  // "Q8", "BF16", ... ("BF16+Q8" when mixed)
  int64_t tensors = 0;
  uint64_t bytes = 0;
};
std::vector<WeightFamilyStorage> describe_weight_storage(const ModelWeights& w);

// Visits every matrix of the model with its family name and whether load-time conversion applies.
void for_each_matrix(ModelWeights& w, const std::function<void(const char* family, Matrix& m, bool convert)>& fn,
                     bool quantize_lm_head = true);

// Bytes of weights read per decoded token: all matrices except the unselected experts (top-k of
// E), one embedding row, the 1-D vectors; `bytes_state` is added by the caller. A batched step
// reads each distinct expert once, so its weight bytes are this at the step's mean number of
// distinct experts per layer (fractional).
uint64_t weight_bytes_per_token(const ModelWeights& w, double experts_per_token);

}  // namespace kiln::engine
