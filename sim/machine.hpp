// Machine model of a NeuronCore-like tile accelerator, loaded from JSON where every number names
// its source.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tilelab::sim {

// One point of the DMA efficiency curve: the fraction of per-engine peak reached by transfers with
// this many contiguous bytes per partition.
struct DmaEfficiencyPoint {
  double bytes_per_partition = 0;
  double efficiency = 0;
};

// All machine numbers the simulator uses. Field names equal the JSON keys; units are in the names.
struct Machine {
  std::string name;
  std::string description;
  int nc_version = 0;

  // Memories.
  int partitions = 0;
  int64_t sbuf_bytes_per_partition = 0;
  int64_t psum_bytes_per_partition = 0;
  int psum_banks = 0;
  int64_t psum_bank_bytes_per_partition = 0;

  // Engine clocks and TensorE peak.
  double tensor_clock_ghz = 0;
  double vector_clock_ghz = 0;
  double scalar_clock_ghz = 0;
  double gpsimd_clock_ghz = 0;
  double sync_clock_ghz = 0;
  double tensor_peak_bf16_tflops = 0;

  // Operand limits.
  int matmul_max_contraction = 0;
  int matmul_max_stationary_free = 0;
  int matmul_max_moving_free = 0;
  int64_t engine_max_free_elements_sbuf = 0;
  int64_t engine_max_free_elements_psum = 0;
  int64_t bn_stats_max_free_elements = 0;  // nl.tile_size.bn_stats_fmax
  // pe_transpose may write a bf16/fp16 input's own dtype to PSUM instead of fp32.
  bool pe_transpose_16bit_output_supported = false;

  // Cost formula constants (engine cycles).
  int matmul_stationary_floor_cycles = 0;
  int matmul_fp32_cost_multiplier = 0;
  int transpose_free_floor_cycles = 0;
  int min_ii_cycles = 0;
  int activation_reduce_extra_cycles = 0;
  int gpsimd_start_overhead_cycles = 0;
  int stride_penalty_threshold_bytes = 0;
  double stride_penalty_factor = 0;
  int engine_access_overhead_cycles = 0;
  bool engine_access_overhead_applied = false;
  double vector_16bit_copy_speedup_contiguous = 1;
  double vector_16bit_copy_speedup_other = 1;
  double vector_tensor_tensor_16bit_sbuf_speedup = 1;

  // Synchronisation and shared ports.
  bool vector_gpsimd_share_sbuf_port = false;
  bool vector_scalar_share_psum_port = false;
  int semaphore_wait_cycles = 0;

  // DMA and HBM.
  int dma_engines = 0;
  int dma_queues_per_engine = 0;
  int dma_partitions_per_engine = 0;
  double dma_bytes_per_ns_per_engine = 0;
  double dma_fixed_cost_ns_per_piece = 0;
  // An engine starts at most one contiguous run (descriptor) per this many ns.
  double dma_descriptor_ns = 0;
  double dma_start_latency_ns = 0;
  int dma_trigger_cycles = 0;
  std::vector<DmaEfficiencyPoint> dma_efficiency_curve;
  bool dma_transpose_supported = false;
  double dma_transpose_efficiency_hbm_to_sbuf = 0;
  double dma_transpose_efficiency_sbuf_to_sbuf = 0;
  int swdge_descriptor_fixed_cycles = 0;
  double swdge_descriptor_cycles_per_partition = 0;
  double hbm_bytes_per_ns = 0;

  // Key -> source text ("AR2: aws-neuron/...", "override"), for reports and --describe.
  std::map<std::string, std::string> source_of_key;

  // Fraction of per-engine DMA peak for transfers of `bytes_per_partition` contiguous bytes per
  // partition: log-linear between curve points, proportional below the first, flat above the last.
  double dma_efficiency(double bytes_per_partition) const;
  // Peak TensorE flops per ns for 16-bit inputs, from partitions^2 x 2 x clock.
  double tensor_peak_flops_per_ns() const;
};

// Machine JSON (sim/machines/*.json):
//   {"schema": "tilelab.machine", "schema_version": 1, "name": "...", "description": "...",
//    "sources": {"<tag>": "<repository@commit path>", ...},
//    "parameters": {"<key>": {"value": <number|bool|[[bytes, efficiency], ...]>,
//                             "source": "<tag>", "note": "<optional>"}, ...}}
// Every key of Machine above must be present exactly once, each naming a tag of "sources", except
// capability keys (pe_transpose_16bit_output_supported): left out, the capability is off.

// Loads a machine: `preset_or_path` is a built-in preset name ("trn1", "trn2") or a path to a JSON
// file. `overrides` are "key=value" strings (value in JSON syntax) applied before validation.
// Throws tilelab::Error naming the file and key on malformed, unknown, missing or inconsistent
// keys.
Machine load_machine(const std::string& preset_or_path,
                     const std::vector<std::string>& overrides = {});

// Parses machine JSON text; `origin` names the text in error messages.
Machine parse_machine_json(const std::string& text, const std::string& origin,
                           const std::vector<std::string>& overrides = {});

// Every machine parameter as the machine JSON declares it, in declaration order.
struct MachineField {
  std::string name;
  std::string kind;  // "integer", "number", "boolean" or "curve" ([[bytes, efficiency], ...])
  double min = 0;
  double max = 0;
};
const std::vector<MachineField>& machine_fields();

// The build-time limits: the keys a program is built and validated against (partitions, memory
// capacities, operand limits, capabilities, the DMA engine and queue layout). Every other key is
// a timing parameter, which simulate_timing(program, machine) may change without a rebuild.
const std::vector<std::string>& machine_build_limits();
// Throws tilelab::Error naming the first build-time limit in which `timing` differs from
// `built_for`, with both values.
void require_same_build_limits(const Machine& built_for, const Machine& timing);
// The value of one parameter, in its JSON form. Throws tilelab::Error for an unknown name.
nlohmann::json machine_field_value(const Machine& machine, const std::string& name);
// Sets one parameter, validated as a JSON override is (type, range, then consistency with the
// other keys); on error the machine is unchanged. Its source becomes "override".
void set_machine_field(Machine& machine, const std::string& name, const nlohmann::json& value);

// The built-in preset names and their JSON text (embedded from sim/machines at build time).
std::vector<std::string> machine_preset_names();
std::string machine_preset_json(const std::string& name);

}  // namespace tilelab::sim
