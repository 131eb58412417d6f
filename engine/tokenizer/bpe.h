// Byte-level BPE: bytes → initial byte tokens → repeatedly merge the adjacent pair with the lowest
// merge rank (leftmost first on ties), as the `tokenizers` library's BPE model does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace kiln::engine {

// Open-addressing map from a token pair to (rank, merged id). Built once, then read-only.
class MergeTable {
 public:
  void reserve(std::size_t n);
  void insert(TokenId left, TokenId right, std::uint32_t rank, TokenId merged);
  // Returns false when the pair has no merge.
  bool find(TokenId left, TokenId right, std::uint32_t& rank, TokenId& merged) const {
    if (slots_.empty()) return false;
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = hash(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) {
        rank = s.rank;
        merged = s.merged;
        return true;
      }
      if (s.key == kEmpty) return false;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};
  struct Slot {
    std::uint64_t key = kEmpty;
    std::uint32_t rank = 0;
    TokenId merged = 0;
  };
  static std::uint64_t pack(TokenId l, TokenId r) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(l)) << 32) |
           static_cast<std::uint32_t>(r);
  }
  std::size_t hash(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_) & mask_;
  }
  std::vector<Slot> slots_;
  std::size_t mask_ = 0;
  int shift_ = 0;
  std::size_t size_ = 0;
};

class BpeModel {
 public:
  // `byte_ids[b]` is the id of the single-byte token for byte b (-1 when the vocab lacks it).
  BpeModel(std::array<TokenId, 256> byte_ids, MergeTable merges);

  // Appends the ids of one pre-tokenized piece (raw bytes). Uses and fills the piece cache.
  void encode_piece(std::string_view piece, std::vector<TokenId>& out) const;
  // The same without the cache; `heap` selects the O(n log n) algorithm used for long pieces.
  void encode_piece_uncached(std::string_view piece, std::vector<TokenId>& out, bool heap) const;

 private:
  std::size_t merge_small(TokenId* ids, std::size_t n) const;  // returns the new length
  void merge_heap(std::vector<TokenId>& ids) const;

  std::array<TokenId, 256> byte_ids_;
  MergeTable merges_;
  // Identifies this model to the per-thread piece caches (see bpe.cpp); never reused.
  std::uint64_t instance_id_;
};

}  // namespace kiln::engine
