// tilelab_machine_peak: this machine's fp32 FMA peak and, where the CPU has AVX-512 BF16, its bf16
// dot-product peak (GFLOP/s), STREAM triad bandwidth and the bandwidth of reading short blocks in a
// random order (GB/s), with N OpenMP threads, as JSON; the benchmarks divide their figures by
// these. --bandwidth-only leaves out the compute peaks (null), --compute-only the bandwidths: the
// benchmarks run one or the other just before and just after the calls of a workload, whose rate
// they judge against what the machine gave at that moment.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TILELAB_X86 1
#endif

namespace {

// Independent accumulator chains per thread. An FMA has 4 cycles of latency and two pipes issue
// one each per cycle, so 8 chains keep them busy; 12 leaves margin (Zen 4 splits a zmm FMA into
// two 256-bit halves) and fits the 16 (AVX2) or 32 (AVX-512) vector registers with the constants.
constexpr int kChains = 12;

// Each FMA computes acc = acc * a + b with a < 1: the chains converge to b / (1 - a) and never
// reach infinities or denormals, which would change the timing.
constexpr float kMultiplier = 0.999999f;
constexpr float kAddend = 1e-6f;

#if TILELAB_X86
// The sum of every lane of the chains, so that none of them is dead code.
__attribute__((target("avx512f"))) float sum_of_chains(const __m512 (&acc)[kChains]) {
  __m512 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm512_add_ps(sum, acc[c]);
  // A store instead of _mm512_reduce_add_ps, whose GCC 12 header trips -Wuninitialized.
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

__attribute__((target("avx512f"))) float fma_chains_avx512(std::int64_t iterations) {
  const __m512 a = _mm512_set1_ps(kMultiplier);
  const __m512 b = _mm512_set1_ps(kAddend);
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  }
  return sum_of_chains(acc);
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2(std::int64_t iterations) {
  const __m256 a = _mm256_set1_ps(kMultiplier);
  const __m256 b = _mm256_set1_ps(kAddend);
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
  }
  __m256 sum = acc[0];
  for (int c = 1; c < kChains; ++c) sum = _mm256_add_ps(sum, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float lane : lanes) total += lane;
  return total;
}

// vdpbf16ps: acc += a[2i]·b[2i] + a[2i+1]·b[2i+1] per fp32 lane, 32 multiply-adds per zmm. The
// products (1e-6) keep the sums finite and normal over any iteration count.
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(std::int64_t iterations) {
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  for (std::int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, a);
  }
  return sum_of_chains(acc);
}
#endif

// Portable fallback: whatever the compiler makes of scalar multiply-adds.
float fma_chains_scalar(std::int64_t iterations) {
  float acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = static_cast<float>(c);
  for (std::int64_t i = 0; i < iterations; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * kMultiplier + kAddend;
  }
  float total = 0.0f;
  for (float value : acc) total += value;
  return total;
}

struct FmaKernel {
  const char* isa;
  int lanes;  // multiply-adds per instruction
  float (*run)(std::int64_t iterations);
};

FmaKernel best_fma_kernel() {
#if TILELAB_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {"avx512f", 16, fma_chains_avx512};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return {"avx2+fma", 8, fma_chains_avx2};
  }
#endif
  return {"scalar", 1, fma_chains_scalar};
}

// The bf16 dot-product kernel, when the CPU has one (its `run` is null otherwise).
FmaKernel bf16_dot_kernel() {
#if TILELAB_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) return {"avx512bf16", 32, bf16_dot_chains};
#endif
  return {"none", 0, nullptr};
}

// Keeps the accumulator results observable so the loops are not removed.
volatile float g_sink = 0.0f;

// GFLOP/s of all threads running `kernel` at once, best of `trials` (a peak is a maximum).
double measure_fma_gflops(const FmaKernel& kernel, int threads, std::int64_t iterations,
                          int trials) {
  double best = 0.0;
  for (int trial = 0; trial < trials; ++trial) {
    double seconds = 0.0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp barrier
      const double start = omp_get_wtime();
      const float result = kernel.run(iterations);
      const double elapsed = omp_get_wtime() - start;
#pragma omp critical
      {
        g_sink = g_sink + result;
        seconds = std::max(seconds, elapsed);  // the slowest thread bounds the aggregate rate
      }
    }
    const double flops = 2.0 * kChains * kernel.lanes * static_cast<double>(iterations) * threads;
    best = std::max(best, flops / seconds * 1e-9);
  }
  return best;
}

// STREAM triad a = b + s * c over arrays of `elements` doubles, GB/s counting 3 arrays x 8 bytes
// per element (STREAM's convention: write-allocate traffic not counted), best of `trials`.
double measure_triad_gb_per_s(int threads, std::int64_t elements, int trials) {
  std::unique_ptr<double[]> a(new double[elements]);
  std::unique_ptr<double[]> b(new double[elements]);
  std::unique_ptr<double[]> c(new double[elements]);
  // First touch with the same static schedule as the triad, so pages sit near the thread using
  // them.
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < elements; ++i) {
    a[i] = 0.0;
    b[i] = 1.0;
    c[i] = 2.0;
  }
  const double s = 3.0;
  double best = 0.0;
  for (int trial = 0; trial < trials; ++trial) {
    const double start = omp_get_wtime();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t i = 0; i < elements; ++i) a[i] = b[i] + s * c[i];
    const double seconds = omp_get_wtime() - start;
    best = std::max(best, 3.0 * 8.0 * static_cast<double>(elements) / seconds * 1e-9);
  }
  g_sink = g_sink + static_cast<float>(a[elements / 2]);
  return best;
}

// lanes[l] += block[k + l] for every line of a block: 16 independent partial sums (one cache line),
// vector adds that never wait on each other. Compiled for AVX2 too: the x86-64 baseline's SSE adds
// alone measured 0.7 times the rate.
__attribute__((target_clones("arch=x86-64-v3", "default"))) void add_block(const float* block,
                                                                           std::int64_t floats,
                                                                           float* lanes) {
  float sums[16] = {};  // local: lanes could alias block
  for (std::int64_t k = 0; k < floats; k += 16) {
    for (int l = 0; l < 16; ++l) sums[l] += block[k + l];
  }
  for (int l = 0; l < 16; ++l) lanes[l] += sums[l];
}

// Reads two arrays of `bytes` each (K and V) as blocks of `block_bytes` visited in one random
// order, block b of both in turn, the way decode reads a paged KV cache with short blocks: GB/s,
// best of `trials`. Short runs at scattered addresses keep the hardware prefetcher from running
// ahead, so each thread prefetches the blocks kPrefetchBlocks ahead into L2 (as the paged kernel
// does; without it the rate is about 0.6 times as high). This is the ceiling of such a cache's
// reads, below the triad.
double measure_block_read_gb_per_s(int threads, std::int64_t bytes, std::int64_t block_bytes,
                                   int trials) {
  constexpr std::int64_t kPrefetchBlocks = 4;
  const std::int64_t floats = bytes / 4, block_floats = block_bytes / 4;
  const std::int64_t blocks = floats / block_floats;
  // Transparent huge pages where the kernel offers them, as numpy asks for its large arrays (with
  // 4 KiB pages every block would also be a TLB miss).
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  const std::size_t allocation =
      (static_cast<std::size_t>(bytes) + kHugePage - 1) / kHugePage * kHugePage;
  const auto allocate = [&] {
    std::unique_ptr<float, decltype(&std::free)> data(
        static_cast<float*>(std::aligned_alloc(kHugePage, allocation)), &std::free);
#if defined(__linux__)
    if (data) madvise(data.get(), allocation, MADV_HUGEPAGE);
#endif
    return data;
  };
  const auto keys = allocate(), values = allocate();
  if (!keys || !values) return 0.0;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < floats; ++i) keys.get()[i] = values.get()[i] = 1.0f;
  std::vector<std::int64_t> order(blocks);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(12345));
  double best = 0.0;
  for (int trial = 0; trial < trials; ++trial) {
    float total = 0.0f;
    const double start = omp_get_wtime();
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : total)
    for (std::int64_t b = 0; b < blocks; ++b) {
      if (b + kPrefetchBlocks < blocks) {
        const std::int64_t ahead = order[b + kPrefetchBlocks] * block_floats;
        for (std::int64_t k = 0; k < block_floats; k += 16) {
          _mm_prefetch(reinterpret_cast<const char*>(keys.get() + ahead + k), _MM_HINT_T1);
          _mm_prefetch(reinterpret_cast<const char*>(values.get() + ahead + k), _MM_HINT_T1);
        }
      }
      float lanes[16] = {};
      add_block(keys.get() + order[b] * block_floats, block_floats, lanes);
      add_block(values.get() + order[b] * block_floats, block_floats, lanes);
      for (const float lane : lanes) total += lane;
    }
    const double seconds = omp_get_wtime() - start;
    best = std::max(best, 2.0 * static_cast<double>(blocks * block_bytes) / seconds * 1e-9);
    g_sink = g_sink + total;
  }
  return best;
}

// Block sizes measured by default: one kv head's 16-key block of head dim 128 in bf16 and in fp8.
const std::vector<std::int64_t> kDefaultReadBlockBytes = {2048, 4096};

// "--read-blocks 2048,32768": positive multiples of 64 bytes (whole cache lines); empty on any
// other text.
std::vector<std::int64_t> parse_block_bytes(const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    char* end = nullptr;
    const long long bytes = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || bytes <= 0 || bytes % 64 != 0) return {};
    sizes.push_back(bytes);
    start = comma + 1;
  }
  return sizes;
}

void usage() {
  std::fprintf(stderr,
               "usage: tilelab_machine_peak [--threads N] [--fma-iterations K] "
               "[--triad-mib MIB] [--trials T] [--bandwidth-only | --compute-only]\n"
               "       [--read-blocks B1,B2,...]\n"
               "  prints JSON: fp32 FMA and bf16 dot peaks (GFLOP/s; null with --bandwidth-only),\n"
               "  STREAM triad bandwidth and random-order, prefetched reads of blocks of two\n"
               "  arrays (GB/s; null with --compute-only), of 2048 and 4096 bytes or of the\n"
               "  --read-blocks sizes (positive multiples of 64 bytes, at most the triad array)\n");
}

}  // namespace

int main(int argc, char** argv) {
  int threads = omp_get_max_threads();
  std::int64_t fma_iterations = 20'000'000;  // ~0.1 s per trial at 4 GHz
  std::int64_t triad_mib = 256;              // per array: far beyond any L3 on this class of CPU
  int trials = 5;
  bool bandwidth_only = false, compute_only = false;
  std::vector<std::int64_t> read_block_bytes = kDefaultReadBlockBytes;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--threads" && has_value) {
      threads = std::atoi(argv[++i]);
    } else if (arg == "--fma-iterations" && has_value) {
      fma_iterations = std::atoll(argv[++i]);
    } else if (arg == "--triad-mib" && has_value) {
      triad_mib = std::atoll(argv[++i]);
    } else if (arg == "--trials" && has_value) {
      trials = std::atoi(argv[++i]);
    } else if (arg == "--bandwidth-only") {
      bandwidth_only = true;
    } else if (arg == "--compute-only") {
      compute_only = true;
    } else if (arg == "--read-blocks" && has_value) {
      read_block_bytes = parse_block_bytes(argv[++i]);
    } else {
      usage();
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  const std::int64_t triad_elements = triad_mib * 1024 * 1024 / 8;
  const bool blocks_fit =
      std::all_of(read_block_bytes.begin(), read_block_bytes.end(),
                  [&](std::int64_t bytes) { return bytes <= triad_elements * 8; });
  if (threads < 1 || fma_iterations < 1 || triad_mib < 1 || trials < 1 ||
      read_block_bytes.empty() || !blocks_fit || (bandwidth_only && compute_only)) {
    usage();
    return 2;
  }

  const FmaKernel kernel = best_fma_kernel();
  std::string fma_peak = "null", bf16_peak = "null";
  if (!bandwidth_only) {
    char text[32];
    std::snprintf(text, sizeof text, "%.2f",
                  measure_fma_gflops(kernel, threads, fma_iterations, trials));
    fma_peak = text;
    // The same number of instructions as the FMA probe: one bf16 dot product does two
    // multiply-adds per fp32 lane.
    const FmaKernel bf16_kernel = bf16_dot_kernel();
    if (bf16_kernel.run) {
      std::snprintf(text, sizeof text, "%.2f",
                    measure_fma_gflops(bf16_kernel, threads, fma_iterations, trials));
      bf16_peak = text;
    }
  }
  std::string triad = "null", block_reads = "null";
  if (!compute_only) {
    char text[64];
    std::snprintf(text, sizeof text, "%.2f",
                  measure_triad_gb_per_s(threads, triad_elements, trials));
    triad = text;
    block_reads.clear();
    for (const std::int64_t block_bytes : read_block_bytes) {
      std::snprintf(text, sizeof text, "%s\"%lld\": %.2f", block_reads.empty() ? "" : ", ",
                    static_cast<long long>(block_bytes),
                    measure_block_read_gb_per_s(threads, triad_elements * 8, block_bytes, trials));
      block_reads += text;
    }
    block_reads = "{" + block_reads + "}";
  }

  std::printf(
      "{\n"
      "  \"schema\": \"tilelab.machine_peak\",\n"
      "  \"schema_version\": 6,\n"
      "  \"threads\": %d,\n"
      "  \"fma_isa\": \"%s\",\n"
      "  \"fma_chains_per_thread\": %d,\n"
      "  \"fma_peak_fp32_gflop_per_s\": %s,\n"
      "  \"bf16_dot_peak_gflop_per_s\": %s,\n"
      "  \"triad_array_bytes\": %lld,\n"
      "  \"triad_bandwidth_gb_per_s\": %s,\n"
      "  \"random_block_read_gb_per_s\": %s,\n"
      "  \"statistic\": \"best of %d trial%s\"\n"
      "}\n",
      threads, kernel.isa, kChains, fma_peak.c_str(), bf16_peak.c_str(),
      static_cast<long long>(triad_elements * 8), triad.c_str(), block_reads.c_str(), trials,
      trials == 1 ? "" : "s");
  return 0;
}
