// BlockSparseLayout: construction (CSR, local + strided rule, dense block mask), validation, and
// the dense views of it.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "tilelab/blocksparse.hpp"
#include "tilelab/error.hpp"

namespace tilelab {

namespace {

constexpr std::int64_t kMaxInt32 = std::numeric_limits<std::int32_t>::max();

void require_positive(std::int64_t value, const char* name) {
  TILELAB_REQUIRE(value >= 1) << name << ": expected a value >= 1, got " << value;
}

// One head's CSR rows, built row by row.
struct CsrBuilder {
  std::vector<std::int32_t> crow{0};
  std::vector<std::int32_t> col;

  void keep(std::int64_t column) { col.push_back(static_cast<std::int32_t>(column)); }
  void end_row(const char* name) {
    TILELAB_REQUIRE(static_cast<std::int64_t>(col.size()) <= kMaxInt32)
        << name << ": expected at most " << kMaxInt32 << " kept blocks per head (int32 crow), got "
        << col.size();
    crow.push_back(static_cast<std::int32_t>(col.size()));
  }
};

// Packs per-head CSR rows into the layout's [n_heads, R + 1] and [n_heads, nnz_max] arrays.
std::pair<std::vector<std::int32_t>, std::vector<std::int32_t>> pack_heads(
    const std::vector<CsrBuilder>& heads) {
  std::size_t nnz_max = 0;
  for (const CsrBuilder& head : heads) nnz_max = std::max(nnz_max, head.col.size());
  std::vector<std::int32_t> crow, col(heads.size() * nnz_max, -1);
  for (std::size_t h = 0; h < heads.size(); ++h) {
    crow.insert(crow.end(), heads[h].crow.begin(), heads[h].crow.end());
    std::copy(heads[h].col.begin(), heads[h].col.end(), col.begin() + h * nnz_max);
  }
  return {std::move(crow), std::move(col)};
}

}  // namespace

BlockSparseLayout::BlockSparseLayout(std::int64_t n_heads, std::int64_t block_size,
                                     std::vector<std::int32_t> crow, std::vector<std::int32_t> col,
                                     bool causal)
    : n_heads_(n_heads), block_size_(block_size), causal_(causal) {
  require_positive(n_heads, "n_heads");
  require_positive(block_size, "block_size");
  const std::int64_t crow_size = static_cast<std::int64_t>(crow.size());
  const std::int64_t col_size = static_cast<std::int64_t>(col.size());
  TILELAB_REQUIRE(crow_size % n_heads == 0 && crow_size / n_heads >= 2)
      << "crow: expected n_heads x (num_row_blocks + 1) entries with num_row_blocks >= 1 and "
         "n_heads = "
      << n_heads << ", got " << crow_size << " entries";
  TILELAB_REQUIRE(col_size % n_heads == 0)
      << "col: expected n_heads x nnz_max entries with n_heads = " << n_heads << ", got "
      << col_size << " entries";
  num_row_blocks_ = crow_size / n_heads - 1;
  nnz_max_ = col_size / n_heads;
  const std::int64_t rows = num_row_blocks_;

  for (std::int64_t h = 0; h < n_heads; ++h) {
    const std::int32_t* head_crow = &crow[h * (rows + 1)];
    TILELAB_REQUIRE(head_crow[0] == 0)
        << "crow: expected 0 at the start of every head, got " << head_crow[0] << " at head " << h;
    for (std::int64_t r = 0; r < rows; ++r) {
      TILELAB_REQUIRE(head_crow[r + 1] >= head_crow[r])
          << "crow: expected non-decreasing entries, got " << head_crow[r] << " then "
          << head_crow[r + 1] << " at head " << h << ", row " << r;
    }
    TILELAB_REQUIRE(head_crow[rows] <= nnz_max_)
        << "col: expected at least " << head_crow[rows] << " entries per head (crow's last entry "
        << "at head " << h << "), got a row length of " << nnz_max_;
    std::int32_t* head_col = &col[h * nnz_max_];
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int32_t n = head_crow[r]; n < head_crow[r + 1]; ++n) {
        const std::int32_t c = head_col[n];
        TILELAB_REQUIRE(c >= 0 && c < rows) << "col: expected block indices in [0, " << rows
                                            << "), got " << c << " at head " << h << ", row " << r;
        TILELAB_REQUIRE(n == head_crow[r] || c > head_col[n - 1])
            << "col: expected sorted, unique block indices in each row, got " << head_col[n - 1]
            << " then " << c << " at head " << h << ", row " << r;
        TILELAB_REQUIRE(!causal || c <= r)
            << "col: expected no block above the diagonal in a causal layout, got column " << c
            << " at head " << h << ", row " << r << " (pass causal=false for a non-causal layout)";
      }
    }
    std::fill(head_col + head_crow[rows], head_col + nnz_max_, -1);
  }
  crow_ = std::move(crow);
  col_ = std::move(col);
}

BlockSparseLayout BlockSparseLayout::local_strided(std::int64_t n_heads, std::int64_t max_seqlen,
                                                   std::int64_t block_size,
                                                   std::int64_t local_blocks,
                                                   std::int64_t vert_stride, bool homo_head,
                                                   std::optional<std::int64_t> head_sliding_step) {
  require_positive(n_heads, "n_heads");
  require_positive(max_seqlen, "max_seqlen");
  require_positive(block_size, "block_size");
  TILELAB_REQUIRE(local_blocks >= 0) << "local_blocks: expected a value >= 0, got " << local_blocks;
  require_positive(vert_stride, "vert_stride");
  TILELAB_REQUIRE(!head_sliding_step || *head_sliding_step >= 0)
      << "head_sliding_step: expected a value >= 0 or none, got " << *head_sliding_step;
  const std::int64_t rows = (max_seqlen + block_size - 1) / block_size;
  const std::int64_t step =
      homo_head ? 0 : head_sliding_step.value_or(std::max<std::int64_t>(1, vert_stride / n_heads));

  std::vector<CsrBuilder> heads(n_heads);
  for (std::int64_t h = 0; h < n_heads; ++h) {
    // Strided blocks: (kb + h·step + 1) % vert_stride == 0, i.e. kb = first_strided (mod
    // vert_stride), with h·step reduced first so nothing overflows. Generated in order, O(nnz).
    const std::int64_t shift = (h % vert_stride) * (step % vert_stride) % vert_stride;
    const std::int64_t first_strided = (vert_stride - (shift + 1) % vert_stride) % vert_stride;
    for (std::int64_t qb = 0; qb < rows; ++qb) {
      // Local blocks: qb - kb < local_blocks (none when local_blocks is 0).
      const std::int64_t local_begin = std::max<std::int64_t>(0, qb - local_blocks + 1);
      for (std::int64_t kb = first_strided; kb < local_begin; kb += vert_stride) heads[h].keep(kb);
      for (std::int64_t kb = local_begin; kb <= qb; ++kb) heads[h].keep(kb);
      heads[h].end_row("local_strided");
    }
  }
  auto [crow, col] = pack_heads(heads);
  return BlockSparseLayout(n_heads, block_size, std::move(crow), std::move(col), true);
}

BlockSparseLayout BlockSparseLayout::from_dense(const std::vector<std::uint8_t>& block_mask,
                                                std::int64_t n_heads, std::int64_t num_blocks,
                                                std::int64_t block_size, bool causal) {
  require_positive(n_heads, "n_heads");
  require_positive(num_blocks, "num_blocks");
  require_positive(block_size, "block_size");
  TILELAB_REQUIRE(static_cast<std::int64_t>(block_mask.size()) == n_heads * num_blocks * num_blocks)
      << "block_mask: expected n_heads x num_blocks x num_blocks = " << n_heads << " x "
      << num_blocks << " x " << num_blocks << " entries, got " << block_mask.size();
  std::vector<CsrBuilder> heads(n_heads);
  for (std::int64_t h = 0; h < n_heads; ++h) {
    for (std::int64_t r = 0; r < num_blocks; ++r) {
      const std::uint8_t* row = &block_mask[(h * num_blocks + r) * num_blocks];
      for (std::int64_t c = 0; c < num_blocks; ++c) {
        if (!row[c]) continue;
        TILELAB_REQUIRE(!causal || c <= r)
            << "block_mask: expected no block above the diagonal in a causal layout, got column "
            << c << " at head " << h << ", row " << r
            << " (pass causal=false for a non-causal layout)";
        heads[h].keep(c);
      }
      heads[h].end_row("block_mask");
    }
  }
  auto [crow, col] = pack_heads(heads);
  return BlockSparseLayout(n_heads, block_size, std::move(crow), std::move(col), causal);
}

std::vector<std::uint8_t> BlockSparseLayout::to_dense() const {
  const std::int64_t rows = num_row_blocks_;
  std::vector<std::uint8_t> mask(n_heads_ * rows * rows, 0);
  for (std::int64_t h = 0; h < n_heads_; ++h) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (const std::int32_t c : columns(h, r)) mask[(h * rows + r) * rows + c] = 1;
    }
  }
  return mask;
}

std::vector<std::uint8_t> BlockSparseLayout::token_mask(std::int64_t head,
                                                        std::int64_t seqlen) const {
  TILELAB_REQUIRE(head >= 0 && head < n_heads_)
      << "head: expected a head in [0, " << n_heads_ << "), got " << head;
  TILELAB_REQUIRE(seqlen >= 0 && seqlen <= max_seqlen())
      << "seqlen: expected a length in [0, " << max_seqlen()
      << "] (num_row_blocks x block_size), got " << seqlen;
  std::vector<std::uint8_t> mask(seqlen * seqlen, 0);
  for (std::int64_t i = 0; i < seqlen; ++i) {
    std::uint8_t* row = &mask[i * seqlen];
    for (const std::int32_t c : columns(head, i / block_size_)) {
      const std::int64_t begin = c * block_size_;
      const std::int64_t end = std::min({(c + 1) * block_size_, seqlen, causal_ ? i + 1 : seqlen});
      for (std::int64_t j = begin; j < end; ++j) row[j] = 1;
    }
  }
  return mask;
}

double BlockSparseLayout::density() const {
  const double rows = static_cast<double>(num_row_blocks_);
  const double candidates = causal_ ? rows * (rows + 1) / 2 : rows * rows;
  std::int64_t kept = 0;
  for (std::int64_t h = 0; h < n_heads_; ++h) kept += nnz(h);
  return static_cast<double>(kept) / (candidates * static_cast<double>(n_heads_));
}

std::int64_t BlockSparseLayout::nnz(std::int64_t head) const {
  TILELAB_REQUIRE(head >= 0 && head < n_heads_)
      << "head: expected a head in [0, " << n_heads_ << "), got " << head;
  return crow_[head * (num_row_blocks_ + 1) + num_row_blocks_];
}

}  // namespace tilelab
